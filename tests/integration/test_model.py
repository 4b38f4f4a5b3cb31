"""The model as declared, verified state (gpuhost:model), with the real CLI and a real container on one lab: from
an empty lab (the model not on the host, an interrupted download's first 20,000 bytes in the staging directory)
one `up` downloads the tiny real safetensors model (lab/labmodel.py) from the lab's mirror (lab/mirror.py, one
slow shard: the progress line shows), resuming the partial file with an HTTP range (If-Range: the ETag it was
started from), checks it, moves it into place,
mounts the storage read-only into the container (mp0) and serves, with no hand step; a second `up` changes
nothing, and a refresh reads no shard again (the cache); a shard cut short out of band stops the next `up`
before the unit restarts - with or without a refresh first - and the service keeps serving; the simulated SGLang
refuses a missing shard with SGLang's message; the repaired shard lets the change through."""

import json
import os
import re
import urllib.request

import pytest

STACK = 'model'
MODEL = 'Qwen3.5-122B-A10B'
REV = '8177ab06040c16b2ac6d81b49f000d8e8f4f969e'   # Pulumi.lab.yaml's gpuhost:model.revision
SHARD = 'model-00002-of-00003.safetensors'


def health(lab):
    url = 'http://%s:30000/health' % lab.spec['addresses']['container']
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status


def model_dir(lab, revision=REV):
    """A revision's directory on the lab host (config/model.py host_dir: <storage>/<model>@<revision>)."""
    return lab.host.path('var', 'lib', 'gpuhost-models', '%s@%s' % (MODEL, revision))


def shard_path(lab, name=SHARD):
    return os.path.join(model_dir(lab), name)


def served_model_path(lab):
    """The --model-path the running SGLang loaded, as it reports it (/get_model_info)."""
    url = 'http://%s:30000/get_model_info' % lab.spec['addresses']['container']
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())['model_path']


def model_lines(out):
    return [line for line in out.splitlines() if 'model: %s@' % MODEL in line]


SLOW = 'model-00003-of-00003.safetensors'   # lab/mirror.py's slow shard


def mirror_requests(lab):
    try:
        with open(lab.control('mirror-requests.log')) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


@pytest.fixture(scope='module')
def cfg(lab):
    cfg = lab.stack_config()
    cfg['gpuhost:model']['source'] = 'http://%s:8089/%s' % (lab.spec['addresses']['pve'], MODEL)
    lab.write_stack(STACK, cfg)
    return cfg


def test_first_up_downloads_mounts_verifies_and_serves(lab, cfg):
    import shutil
    shutil.rmtree(model_dir(lab))
    with open(os.path.join(lab.dir, 'mirror', MODEL, SLOW), 'rb') as f:
        slow = f.read()
    staging = lab.host.path('var', 'lib', 'gpuhost-models', '.gpuhost-staging',
                            '%s@%s' % (MODEL, cfg['gpuhost:model']['revision']))
    os.makedirs(staging)
    with open(os.path.join(staging, SLOW + '.part'), 'wb') as f:
        f.write(slow[:20000])    # what an interrupted download left: the first bytes, and the version they are of
    head = urllib.request.Request('%s/%s' % (cfg['gpuhost:model']['source'], SLOW), method='HEAD')
    with urllib.request.urlopen(head, timeout=5) as r:
        etag = r.headers['ETag']
    with open(os.path.join(staging, SLOW + '.part.json'), 'w') as f:
        json.dump({'size': len(slow), 'etag': etag, 'identity': etag.strip('"')}, f)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    out = res.stdout + res.stderr
    progress = [line for line in out.splitlines() if 'model: downloading ' in line]
    # At the start, at least every 10 s during the slow shard, at the end: bytes, share, rate, ETA.
    assert any(re.search(r'model: downloading %s@\w+: [\d.]+ kB of 284\.6 kB \(\d+%%\), [\d.]+ kB/s, ETA \d+m\d\ds - %s'
                         % (re.escape(MODEL), SLOW), line) for line in progress), progress
    assert 'model: downloaded 5 files (264.6 kB; 20.0 kB resumed from an earlier attempt)' in out, progress
    ranges = [r for r in mirror_requests(lab) if r['path'].endswith(SLOW) and r.get('method') == 'GET']
    assert [(r['range'], r['if_range']) for r in ranges] == [('bytes=20000-', etag)] and ranges[0]['status'] == 206
    lines = model_lines(out)
    assert lines and re.search(r'%s@8177ab06040c16b2ac6d81b49f000d8e8f4f969e: 3/3 shards, 284\.6 kB, verified '
                               r'\(5 sha256, ' % re.escape(MODEL), lines[-1]), lines
    assert not os.listdir(staging)
    assert health(lab) == 200
    ct = lab.node().lxc(200).config.get()
    assert ct['mp0'] == '/var/lib/gpuhost-models,mp=/models,ro=1'
    # The container reads the weights and cannot write them.
    seen = lab.ct_exec(['cat', '/models/%s@%s/config.json' % (MODEL, REV)]).stdout
    assert json.loads(seen)['model_type'] == 'qwen3_moe'
    assert lab.ct_exec(['touch', '/models/%s@%s/x' % (MODEL, REV)], check=False).returncode != 0
    assert served_model_path(lab) == '/models/%s@%s' % (MODEL, REV)
    out = lab.outputs(STACK)['model']
    assert (out['id'], out['shards'], out['bytes'], out['verified']) == (MODEL, 3, 284592, True)
    assert re.match(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$', out['verified_at'])
    with open(lab.host.path('var', 'lib', 'prometheus', 'node-exporter', 'gpuhost-model.prom')) as f:
        prom = f.read()
    assert 'gpuhost_model_verified{model="%s",revision="8177ab06040c16b2ac6d81b49f000d8e8f4f969e"} 1' % MODEL in prom
    assert 'state="expected"} 3' in prom and 'gpuhost_model_size_bytes{' in prom


def test_second_up_changes_nothing_and_a_refresh_reads_no_shard(lab, cfg):
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', stack=STACK)
    assert re.search(r'\b\d+ unchanged\b', res.stdout) and ' to update' not in res.stdout and \
        ' updated' not in res.stdout, res.stdout[-3000:]
    res = lab.pulumi('refresh', '--yes', stack=STACK)
    lines = model_lines(res.stdout + res.stderr)
    assert lines and 'verified (5 sha256, 0 B of shards read)' in lines[0], lines
    assert lab.unit_starts() == starts


def test_a_shard_cut_short_stops_the_restart_and_the_service_keeps_serving(lab, cfg):
    path = shard_path(lab)
    size = os.path.getsize(path)
    # The operator's own weights (no source): a new unit, which the up would restart.
    changed = json.loads(json.dumps(cfg))
    del changed['gpuhost:model']['source']
    changed['gpuhost:sglang']['environment']['LAB_MODEL_TEST'] = '1'
    # With a change of the host's own too (the nvidia option file, which the host's steps write first): the
    # preflight refuses the weights before any step, so the host is left as it was.
    hostile = json.loads(json.dumps(changed))
    hostile['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
    lab.write_stack(STACK, hostile)
    os.truncate(path, size - 1000)
    starts, digest = lab.unit_starts(), lab.host_digest()
    # Without a refresh: the preflight's quick look (sizes), before any step writes or restarts anything.
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and lab.host_digest() == digest
    assert 'gpuhost:model.source is not set, so nothing can download them' in out and \
        'nothing else on the host was changed' in out, out[-3000:]
    lab.write_stack(STACK, changed)
    assert '1 short: %s (%d of %d bytes)' % (SHARD, size - 1000, size) in out, \
        [line for line in out.splitlines() if 'error' in line or 'short' in line]
    assert 'The SGLang unit was not touched: the running service keeps serving' in out
    assert lab.unit_starts() == starts and health(lab) == 200
    assert 'LAB_MODEL_TEST' not in lab.ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout
    # A refresh shows it; the next up stops at the model itself.
    res = lab.pulumi('refresh', '--yes', stack=STACK)
    assert any('2/3 shards' in line and '1 short: %s' % SHARD in line
               for line in model_lines(res.stdout + res.stderr)), res.stdout[-3000:]
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    assert res.returncode != 0 and '1 short: %s' % SHARD in res.stdout + res.stderr
    assert lab.unit_starts() == starts and health(lab) == 200
    # The simulated SGLang, started by hand on a directory missing the shard, refuses as SGLang does.
    os.rename(path, path + '.away')
    run = lab.ct_exec(['env', 'CUDA_HOME=/usr/local/cuda-13.0', '/opt/sglang/venv/bin/python', '-m',
                       'sglang.launch_server', '--model-path', '/models/%s@%s' % (MODEL, REV), '--port', '30999'], check=False)
    assert run.returncode == 1 and 'references 1 shard file(s) that are not on disk: %s. Incomplete download?' \
        % SHARD in run.stderr, run.stderr
    os.rename(path + '.away', path)
    # With the source declared again, the up downloads the shard anew, checks it, moves it in, and the change goes
    # through with one restart.
    changed['gpuhost:model']['source'] = cfg['gpuhost:model']['source']
    lab.write_stack(STACK, changed)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'model: downloaded 1 files (50.5 kB; 0 B resumed from an earlier attempt)' in res.stdout + res.stderr
    assert os.path.getsize(path) == size
    assert health(lab) == 200 and lab.unit_starts() == starts + 1
    assert 'LAB_MODEL_TEST' in lab.ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout
    assert lab.outputs(STACK)['model']['verified'] is True


def mirror_revision(lab, revision, edit=None):
    """The lab model at another revision (other weights: lab/labmodel.py seeds them with it) on the lab's mirror,
    its config.json changed by `edit` if given, and its checksum file beside the lab's; returns (source, checksums)
    as the stack names them."""
    import hashlib
    from lab import labmodel
    files = labmodel.files(MODEL, revision)
    if edit:
        files['config.json'] = (json.dumps(edit(json.loads(files['config.json'])), indent=2) + '\n').encode()
    name = '%s-%s' % (MODEL, revision)
    os.makedirs(os.path.join(lab.dir, 'mirror', name), exist_ok=True)
    sums = []
    for fname, data in sorted(files.items()):
        with open(os.path.join(lab.dir, 'mirror', name, fname), 'wb') as f:
            f.write(data)
        sums.append('%s  %s\n' % (hashlib.sha256(data).hexdigest(), fname))
    with open(os.path.join(lab.dir, 'model', '%s.sha256' % name), 'w') as f:
        f.write(''.join(sums))
    return 'http://%s:8089/%s' % (lab.spec['addresses']['pve'], name), '.lab/model/%s.sha256' % name


def at_revision(lab, cfg, revision, edit=None):
    changed = json.loads(json.dumps(cfg))
    changed['gpuhost:sglang']['environment']['LAB_MODEL_TEST'] = '1'   # as the test before left it
    source, sums = mirror_revision(lab, revision, edit)
    changed['gpuhost:model'].update(revision=revision, source=source, checksums=sums)
    lab.write_stack(STACK, changed)


def test_a_new_revision_is_downloaded_beside_the_old_and_switched_to_with_one_restart(lab, cfg):
    at_revision(lab, cfg, 'v2')
    res = lab.pulumi('preview', '--diff', stack=STACK)
    out = res.stdout + res.stderr
    assert 'the model revision changes: %s@%s -> %s@v2' % (MODEL, REV, MODEL) in out, out[-3000:]
    assert '--model-path /models/%s@v2' % MODEL in out
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode == 0, [line for line in out.splitlines() if 'error' in line.lower()]
    # Downloaded and verified into its own directory while the old revision served; then one restart.
    assert 'model: downloaded 5 files' in out and 'moved into /var/lib/gpuhost-models/%s@v2' % MODEL in out
    assert lab.unit_starts() == starts + 1 and health(lab) == 200
    assert served_model_path(lab) == '/models/%s@v2' % MODEL
    # The old revision's directory went once the new one served.
    assert 'the previous revision %s was removed from the host' % REV in out
    assert os.path.isdir(model_dir(lab, 'v2')) and not os.path.exists(model_dir(lab))
    assert lab.outputs(STACK)['model']['revision'] == 'v2'


def test_a_revision_sglang_refuses_is_rolled_back_and_the_old_one_keeps_serving(lab, cfg):
    # Weights SGLang will not load: an architecture it does not implement (checksums match: verified, then refused).
    at_revision(lab, cfg, 'v3', edit=lambda c: dict(c, architectures=['Qwen9MoeForCausalLM']))
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'sglang-qwen.service failed its check after its restart: ' in out and \
        'It had restarted with the new model revision v3 (/var/lib/gpuhost-models/%s@v3).' % MODEL in out, out[-3000:]
    assert 'Rolled back: container 200 runs the previous unit again' in out and \
        'model revision v2 (/var/lib/gpuhost-models/%s@v2)' % MODEL in out
    # Started on the new revision (refused), then on the old one again; it serves the old weights.
    assert lab.unit_starts() == starts + 2 and health(lab) == 200
    assert served_model_path(lab) == '/models/%s@v2' % MODEL
    journal = lab.ct_exec(['journalctl', '--no-pager', '-u', 'sglang-qwen.service']).stdout
    assert "Model architectures ['Qwen9MoeForCausalLM'] are not supported for now" in journal
    # Both revisions stay on the host until a revision serves.
    assert os.path.isdir(model_dir(lab, 'v2')) and os.path.isdir(model_dir(lab, 'v3'))


def test_a_previous_revision_that_cannot_be_removed_never_fails_the_run(lab, cfg):
    """Issue 27, item 1: after a switch has served, the old revision's directory is removed; when that fails (here a
    mount inside it: busy), the run still succeeds, says so, and the next `up` removes it - without a restart."""
    busy = '/var/lib/gpuhost-models/%s@v2/busy' % MODEL
    res = lab.on_host('mkdir -p /run/lab-empty %s && mount --bind -o ro /run/lab-empty %s' % (busy, busy))
    assert res.exit_code == 0, res
    try:
        at_revision(lab, cfg, 'v4')
        starts = lab.unit_starts()
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        out = res.stdout + res.stderr
        assert res.returncode == 0, [line for line in out.splitlines() if 'error' in line.lower()]
        assert 'removing the previous revision v2 (/var/lib/gpuhost-models/%s@v2) failed' % MODEL in out, out[-3000:]
        assert 'the next `up` tries again' in out
        assert served_model_path(lab) == '/models/%s@v4' % MODEL and lab.unit_starts() == starts + 1
    finally:
        lab.on_host('umount %s' % busy)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    out = res.stdout + res.stderr
    assert 'the previous revision v2 was removed from the host' in out, out[-3000:]
    assert lab.on_host('test -e /var/lib/gpuhost-models/%s@v2' % MODEL).exit_code != 0
    assert lab.unit_starts() == starts + 1 and health(lab) == 200
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
