"""The lock grammar (grammar/pylock.py): pip's requirements-file rules, every package pinned with sha256."""

import os

import pytest

from grammar import pylock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
H1, H2 = 'a' * 64, 'b' * 64


def test_pip_compile_output_reads_as_pip_reads_it():
    # A real pip-compile --generate-hashes lock: the bench virtualenv's, 139 packages.
    with open(os.path.join(REPO, 'requirements-bench.txt')) as f:
        lock = pylock.parse(f.read())
    assert len(lock.pins) == 139
    aiohttp = lock.get('aiohttp')
    assert aiohttp.version == '3.14.5' and len(aiohttp.hashes) > 10
    assert lock.get('AIOHTTP') is aiohttp, 'names compare as PEP 503 normalises them'


def test_canonical_text_ignores_comments_layout_and_order():
    a = pylock.parse('# header\nsglang==0.5.23 \\\n    --hash=sha256:%s \\\n    --hash=sha256:%s\n    # via -r x\n'
                     'pip==24.0 --hash=sha256:%s\n' % (H2, H1, H1))
    b = pylock.parse('pip==24.0 --hash sha256:%s\nSGLang==0.5.23 --hash=sha256:%s --hash=sha256:%s  # pinned\n'
                     % (H1, H1, H2))
    assert a.canonical() == b.canonical() and a.sha256() == b.sha256()
    assert a.canonical() == 'pip==24.0 --hash=sha256:%s\nsglang==0.5.23 --hash=sha256:%s --hash=sha256:%s\n' % (
        H1, H1, H2)
    assert a.versions() == {'pip': '24.0', 'sglang': '0.5.23'}


def test_a_changed_hash_is_another_lock():
    a = pylock.parse('sglang==0.5.23 --hash=sha256:%s\n' % H1)
    b = pylock.parse('sglang==0.5.23 --hash=sha256:%s\n' % H2)
    assert a.sha256() != b.sha256()


def test_markers_and_extras_are_kept():
    lock = pylock.parse('torch[cuda]==2.12.0.dev20261101+cu130 ; python_version >= "3.10" --hash=sha256:%s\n' % H1)
    assert lock.get('torch').requirement() == \
        'torch[cuda]==2.12.0.dev20261101+cu130 ; python_version >= "3.10" --hash=sha256:%s' % H1


@pytest.mark.parametrize('text,words', [
    ('sglang==0.5.23\n', ['line 1', 'sglang==0.5.23 has no --hash', 'generate-hashes']),
    ('pip==24.0 --hash=sha256:%s\nsglang==0.5.23\n' % H1, ['line 2', 'no --hash']),
    ('sglang>=0.5 --hash=sha256:%s\n' % H1, ['not pinned to one version']),
    ('sglang --hash=sha256:%s\n' % H1, ['not pinned']),
    ('sglang==0.5.23 --hash=md5:abc\n', ['not sha256:']),
    ('sglang==0.5.23 --hash=sha256:%s\n' % H1.upper(), ['not sha256:']),
    ('--index-url https://u:p@example/simple\nsglang==0.5.23 --hash=sha256:%s\n' % H1,
     ['line 1', '--index-url names a package source', 'gpuhost:runtime.python.index']),
    ('--extra-index-url=https://x\n', ['--extra-index-url']),
    ('-e ./src\n', ['-e']),
    ('-r other.txt\n', ['-r']),
    ('sglang @ https://example/sglang.whl --hash=sha256:%s\n' % H1, ['direct reference']),
    ('sglang==0.5.23 --hash=sha256:%s\nsglang==0.5.22 --hash=sha256:%s\n' % (H1, H2), ['line 2', 'pinned twice']),
    ('sglang==0.5.23 --no-binary :all: --hash=sha256:%s\n' % H1, ['not a --hash option']),
    ('# nothing\n\n', ['pins no package']),
    ('sglang==0.5.23 --hash=sha256:%s\0\n' % H1, ['NUL']),
])
def test_refused(text, words):
    with pytest.raises(pylock.LockError) as e:
        pylock.parse(text)
    message = 'line %d: %s' % (e.value.line, e.value)
    for w in words:
        assert w in message, message
