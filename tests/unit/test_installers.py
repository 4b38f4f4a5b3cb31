"""Installers declared by source (issue 47): what the preview of a first `up` says, and the example stack's
placeholder sha256 refused before anything is downloaded or run."""

import pytest

from resources import runtime
from grammar.installers import PLACEHOLDER_SHA256

NV = 'https://us.download.nvidia.com/XFree86/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run'


def props(sha=('a' * 64)):
    return {'vmid': 200, 'runtime': {'nvidia': '580.95.05', 'cuda': None},
            'install': {'timeout': 3600, 'stall': 600, 'cuda': None, 'python': None,
                        'nvidia': {'installer': '/var/lib/gpuhost/installers/NVIDIA-Linux-x86_64-580.95.05.run',
                                   'sha256': sha, 'source': NV}}}


def test_the_preview_of_a_first_up_names_the_source_and_where_it_is_kept():
    line = runtime.first_install(props())
    assert line == ('the first `up` of container 200 installs, where the container lacks them: the NVIDIA user space '
                    '580.95.05 (the host downloads %s into /var/lib/gpuhost/installers, sha256 aaaaaaaaaaaa... '
                    'checked)' % NV)


def test_the_placeholder_sha256_is_refused_before_any_download():
    class NoHost:
        def __getattr__(self, name):
            raise AssertionError('the host was contacted')
    with pytest.raises(runtime.RuntimeStepError) as e:
        runtime.fetch_installers(NoHost(), props(PLACEHOLDER_SHA256), {'container_driver': None})
    assert str(e.value).startswith('gpuhost:runtime.nvidia.sha256 is the example\'s placeholder (64 zeros), so '
                                   'NVIDIA-Linux-x86_64-580.95.05.run cannot be checked and is neither downloaded nor '
                                   'run: NVIDIA publishes the driver\'s checksum')
    assert str(e.value).endswith('Nothing was installed.')
    assert 'once its sha256 is set' in runtime.first_install(props(PLACEHOLDER_SHA256))


def test_nothing_is_fetched_when_the_container_has_the_version():
    runtime.fetch_installers(None, props(), {'container_driver': '580.95.05'})


def test_a_mirror_token_needs_an_https_source_and_stays_out_of_the_install_input():
    from pydantic import ValidationError
    from config.errors import format_errors
    from config.runtime import NvidiaRuntime, Runtime
    http = NV.replace('https://', 'http://')
    with pytest.raises(ValidationError) as e:
        NvidiaRuntime(version='580.95.05', source=http, sha256='a' * 64, token='a-mirror-token-1234')
    shown = format_errors(e.value, Runtime, ('runtime', 'nvidia'))
    assert 'gpuhost:runtime.nvidia.token needs an https:// source' in shown and 'a-mirror-token-1234' not in shown
    with pytest.raises(ValidationError) as e:
        NvidiaRuntime(version='580.95.05', source=NV, sha256='a' * 64, token='two words')
    shown = format_errors(e.value, Runtime, ('runtime', 'nvidia'))
    assert 'gpuhost:runtime.nvidia.token must be 8-4096 printable characters' in shown and 'two words' not in shown


def test_the_download_job_gets_the_token_on_stdin_only():
    p = props()
    job = runtime.fetch_job(p, 'nvidia', p['install']['nvidia'], 'a-mirror-token-1234')
    assert job.stdin == b'a-mirror-token-1234'
    assert 'a-mirror-token-1234' not in job.spec + ' '.join(job.args) + job.label
