"""ModelWeights: the model SGLang serves, as declared, verified state on the host (gpuhost:model).

The weights live on host storage (gpuhost:model.storage, e.g. a ZFS dataset) and reach the container as a
read-only bind mount point (mpN, resources/container.py). This resource verifies the model directory on the
host with hostscripts/model_verify.py: config.json, model.safetensors.index.json and every shard the
index names, each shard's size against its own safetensors header, and its sha256 against the checksum file
kept in the repository (gpuhost:model.checksums). Computed sums are cached on the host by (size, mtime,
inode), so a verification of unchanged files reads no shard again.

Preview contacts no host (docs/operator-guide.md, "Reading a preview"): `pulumi refresh` (or `preview --refresh`)
looks - sizes, headers and cached
sums, no shard read in full - and says the model's state in one line; a model found not verified is then a
change, and the `up`'s update (which computes the sums still missing) fails naming the files. The SGLang unit
depends on this resource and verifies again itself before it writes or restarts anything (verify_for_unit:
cached, so it reads no shard again), so a missing, short or mismatching shard stops the run before the unit
is restarted, with or without a refresh: the running service keeps serving.
"""

from __future__ import annotations

import hashlib
import json
import os


from transport import jobs, remote
from resources.fields import ANY, B, I, N, S, mapof, optional, secret
from hostscripts.exposition import TEXTFILE_DIR
from resources.resource import CreateResult, UpdateResult
from resources.state import GpuhostResource, ObservedProvider, utc_now
from transport.operator import OperatorError, info, warn

CACHE_DIR = '/var/lib/gpuhost/model-verify'
TEXTFILE = TEXTFILE_DIR + '/gpuhost-model.prom'


class ModelError(OperatorError):
    pass


def human_bytes(n) -> str:
    n = float(n or 0)
    for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
        if n < 1000 or unit == 'TB':
            return ('%d %s' % (n, unit)) if unit == 'B' else ('%.1f %s' % (n, unit))
        n /= 1000.0


def line(rep: dict) -> str:
    """The model's state in one line: "Qwen3.5-122B-A10B@<rev>: 39/39 shards, 244.1 GB, verified"."""
    name = '%s@%s' % (rep.get('id'), rep.get('revision'))
    if rep.get('dir_missing'):
        return '%s: %s' % (name, rep['problems'][0])
    complete = rep['present'] - len(rep['short'])
    parts = ['%d/%d shards' % (complete, rep['shards']), human_bytes(rep['bytes'])]
    if rep['verified']:
        state = 'verified'
        if rep.get('checked_sums'):
            state += ' (%d sha256, %s of shards read)' % (rep['checked_sums'], human_bytes(rep['read_bytes']))
        else:
            state += ' (sizes; %s of shards read)' % human_bytes(rep['read_bytes'])
        parts.append(state)
    else:
        for key, what in (('missing', 'missing'), ('short', 'short'), ('long', 'too long'),
                          ('mismatch', 'sha256 mismatch'), ('unreadable', 'not world-readable (the unprivileged '
                                                                         'container cannot read them)')):
            if rep.get(key):
                parts.append('%d %s: %s' % (len(rep[key]), what, ', '.join(rep[key][:5]) +
                                            (', ...' if len(rep[key]) > 5 else '')))
        if rep.get('unhashed'):
            due = len(rep.get('due') or [])
            parts.append('%d sha256 to compute%s' % (len(rep['unhashed']), ' (%d older than gpuhost:model.rehash_days)'
                                                     % due if due else ''))
        parts += rep.get('problems') or []
    return '%s: %s' % (name, ', '.join(parts))


def verifier_source() -> bytes:
    with open(os.path.join(remote.SCRIPTS, 'model_verify.py'), 'rb') as f:
        return f.read()


def cache_path(directory: str) -> str:
    return '%s/%s.json' % (CACHE_DIR, hashlib.sha256(directory.encode()).hexdigest()[:16])


def verify_args(props, full: bool, textfile: bool = False, fetch: bool = False) -> dict:
    job = {'dir': props['dir'], 'id': props['id'], 'revision': props['revision'],
           'checksums': props.get('checksums'), 'hash': full,
           'cache': cache_path(props['dir']), 'storage': props.get('storage'),
           'textfile': props.get('textfile') if textfile else None,
           'rehash_s': int(float(props['rehash_days']) * 86400) if props.get('rehash_days') else None}
    if fetch and props.get('source'):
        job['source'] = props['source']
        for key in ('connections', 'max_bytes_per_s'):
            if props.get(key) is not None:
                job[key] = props[key]
    return job


def report_of(target, text: str) -> dict:
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ModelError('%s: the model verification printed no report: %s' % (target.name, text[-300:]))


def quick_look_stdin() -> bytes:
    """What a quick look reads: no token line, then the verifier."""
    return b'\n' + verifier_source()


def quick_look_args(props) -> list:
    """model_verify.sh's arguments for run_verify(target, props, full=False) (its stdin: quick_look_stdin())."""
    return [json.dumps(verify_args(props, False), sort_keys=True)]


def run_verify(target, props, full: bool, textfile: bool = False, fetch: bool = False) -> dict:
    """The host-side verification's report. A quick look (full=False: sizes, headers and cached sums; what a
    refresh needs) is one short command; a full verification - hashing what the cache lacks, and with fetch
    downloading what is missing from props['source'] first - is a job on the host (verify_job): hours at the
    real model's size, so it outlives the SSH command and is followed with progress lines."""
    job = verify_args(props, full, textfile, fetch)
    if not full:
        res = remote.run(target, 'model_verify.sh', [json.dumps(job, sort_keys=True)], stdin=quick_look_stdin())
        return report_of(target, res.stdout)
    j = verify_job(props, job, fetch)
    try:
        p = jobs.run(target, j)
    except jobs.JobFailed as e:
        tail = ' | '.join(e.outcome.log[-3:]) if isinstance(e.outcome, jobs.Poll) and e.outcome.log else ''
        raise ModelError('%s%s' % (e, '' if not tail or tail in str(e) else ': ' + tail)) from None
    return report_of(target, p.out or '')


def job_name(props) -> str:
    """One job per model of a storage (not per revision): a new revision's download stops the old one's."""
    return 'gpuhost-model-%s' % jobs.key_of(props.get('storage') or props['dir'], props['id'])


def verify_job(props, job: dict, fetch: bool) -> jobs.Job:
    token = (props.get('token') or '') if fetch and props.get('source') else ''
    what = 'downloading and verifying' if job.get('source') else 'verifying'
    return jobs.Job(name=job_name(props), label='model: %s %s@%s' % (what, props['id'], props['revision'][:12]),
                    spec=jobs.spec_of(job), interpreter='python3', body=verifier_source().decode(),
                    args=(json.dumps(job, sort_keys=True),), stdin=token.encode(),
                    limit_s=int(props.get('timeout_s') or 0), stall_s=int(props.get('stall_timeout_s') or 600),
                    limit_key='gpuhost:model.timeout_s', stall_key='gpuhost:model.stall_timeout_s', prefix='model')


def refusal(rep: dict, props: dict) -> str:
    return ('%s. The SGLang unit was not touched: the running service keeps serving. Put the files named in %s on '
            'the host (from the model\'s source at revision %s), or fix gpuhost:model / the checksum file, and '
            're-run' % (line(rep), props['dir'], props['revision']))


class ModelProvider(ObservedProvider):
    """The model's weights in their directory on the host, downloaded and verified against their sha256 sums by a
    job on the host (transport/jobs.py); refresh re-verifies from the cached sums."""

    # What is declared: the model, its revision, its directory on the host, its checksums - and that it is
    # verified. The report's facts are outputs.
    DESIRED = ('id', 'revision', 'dir', 'checksums', 'verified')
    # source: where the job fetches missing shards from (None: only verified), with the hub's token; checksums:
    # {file: sha256} (None: none declared); the job's limits (gpuhost:model).
    INPUTS = {'id': S, 'revision': S, 'dir': S, 'storage': S, 'checksums': optional(mapof(S)), 'verified': B,
              'source': optional(S), 'token': secret(optional(S)), 'textfile': S, 'timeout_s': optional(N),
              'stall_timeout_s': N, 'rehash_days': optional(N), 'connections': I, 'max_bytes_per_s': optional(I)}
    # report: the verification job's counts and file lists, as it reports them.
    OUTPUTS = {'report': ANY, 'verified_at': S, 'shards': I, 'bytes': I, 'summary': S}

    def observed(self, props, rep) -> dict:
        return {'verified': bool(rep['verified']), 'report': {k: rep.get(k) for k in (
                    'shards', 'present', 'bytes', 'missing', 'short', 'long', 'mismatch', 'unreadable', 'unhashed',
                    'problems', 'checked_sums')},
                'shards': rep['shards'], 'bytes': rep['bytes'], 'summary': line(rep)}

    def apply(self, props, olds=None):
        target = remote.Target.from_inputs(props['connection'])
        fetch = bool(props.get('source'))
        if fetch:
            # Only when something is missing or wrong: a quick look (cached sums) decides.
            quick = run_verify(target, props, full=False)
            fetch = not quick['verified']
        rep = run_verify(target, props, full=True, textfile=True, fetch=fetch)
        if rep.get('fetch_error'):
            raise ModelError('%s: the download from %s failed: %s. The serving model and the SGLang unit were not '
                             'touched; what was downloaded stays in the staging directory and the next `up` resumes' % (
                                 '%s@%s' % (props['id'], props['revision']), props['source'], rep['fetch_error']))
        if rep.get('downloaded'):
            info('model: downloaded %d files (%s; %s resumed from an earlier attempt) from %s, checked, moved into %s'
                 % (len(rep['downloaded']), human_bytes(rep['downloaded_bytes']), human_bytes(rep['resumed_bytes']),
                    props['source'], props['dir']))
        info('model: %s; verification read %s in %.1f s' % (line(rep), human_bytes(rep['read_bytes']),
                                                           rep['elapsed_s']))
        if not rep['verified']:
            raise ModelError(refusal(rep, props))
        outs = dict(props, **self.observed(props, rep))
        same = olds and olds.get('report') == outs['report'] and olds.get('dir') == props['dir'] and \
            olds.get('revision') == props['revision'] and olds.get('verified_at')
        outs['verified_at'] = olds['verified_at'] if same else utc_now()
        return outs

    def create(self, props):
        return CreateResult('model:%s' % props['dir'], self.apply(props))

    def update(self, _id, olds, news):
        return UpdateResult(self.apply(news, olds))

    def read(self, id_, props):
        target = remote.Target.from_inputs(props['connection'])
        rep = run_verify(target, props, full=False)
        (info if rep['verified'] else warn)('model: %s' % line(rep))
        # A shard without a cached sum (new, or changed since it was hashed: another size, mtime or inode) is not
        # verified: a refresh does not read 244 GB, but the `up` after it does - its job hashes what changed and,
        # with a source, fetches again what does not match.
        outs = dict(props, **self.observed(props, rep))
        return self.read_result(id_, outs)

    def delete(self, _id, props):
        # A download or verification still running goes first; the weights stay (the operator's data, not this
        # program's); its textfile and cache go.
        target = remote.Target.from_inputs(props['connection'])
        job = verify_job(props, verify_args(props, True), False)
        if jobs.stop(target, job, 'the model resource is being deleted').stopped_now:
            info('model: stopped job %s on the host (the model resource is being deleted)' % job.name)
        jobs.forget(target, job)
        remote.run(target, 'model_forget.sh', [props.get('textfile') or TEXTFILE, cache_path(props['dir'])])


def broken(rep) -> bool:
    return bool(rep['problems'] or rep['missing'] or rep['short'] or rep['long'] or rep['mismatch'] or
                rep['unreadable'])


class ModelWeightsResource(GpuhostResource, name='ModelWeights'):
    """The model directory on the host, verified (ModelProvider)."""


def declared(d):
    """What the SGLang unit needs to know of the model: which one it serves (a new revision restarts it)."""
    return {'id': d.model.id, 'revision': d.model.revision} if d.model else None


def unit_check(d, model_files=None):
    """What the SGLang unit verifies before it restarts (not compared: the model resource owns the state)."""
    if d.model is None:
        return None
    return {'id': d.model.id, 'revision': d.model.revision, 'dir': d.model.host_dir(d.sglang.model_path),
            'storage': d.model.storage, 'timeout_s': d.model.timeout_s, 'stall_timeout_s': d.model.stall_timeout_s,
            'rehash_days': d.model.rehash_days,
            'checksums': (model_files or {}).get('checksums')}


def verify_for_unit(target, check) -> None:
    """Before the SGLang unit is written or restarted: the weights it will load are complete (cached sums: no
    shard is read again unless it changed). Raises ModelError naming the files; nothing was changed."""
    rep = run_verify(target, check, full=True)
    if not rep['verified']:
        raise ModelError(refusal(rep, check))
