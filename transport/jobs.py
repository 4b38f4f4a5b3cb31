"""Long steps as durable jobs: transient systemd units on the host (or in the container) that outlive the SSH
command, the connection and `pulumi` itself (hostscripts/job.sh).

A real model is ~244 GB and a real environment several GB; neither downloads, hashes or installs within one SSH
command's time limit (gpuhost:host.ssh.command_timeout, which means "one short remote command"). So such a step
starts a unit named after what it works on (`gpuhost-model-<key>`, `gpuhost-envbuild`, ...), and `up` follows
it with short polls, relaying its progress at least every 10 s. Like Ansible's async + async_status:

  * a second start of the same job (the same name and declaration) re-attaches to the one running - never a
    second copy (job.sh takes a lock and asks systemd); a changed declaration stops the running one first;
  * an SSH drop while following it, a Ctrl-C or a killed `pulumi` leave it running; the next `up` re-attaches
    and carries on from where it is;
  * it ends with a result the poll reads (systemd's ExecStopPost writes it, however the process ended), its
    output and the last lines of its log; a failure is one line naming the job, why, and where its log is;
  * each kind has its own time limit (RuntimeMaxSec, from the config; none for downloads by default) and a stall
    detector: no progress (the job's own counter, or without one its CPU time) for `stall_s` seconds stops it
    and fails the step, named. Partial work stays where the job keeps it, for the next attempt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from typing import Callable, Optional

from transport import remote
from transport.operator import CANCELLED, OperatorError, info

JOBS_DIR = '/var/lib/gpuhost/jobs'
# How often `up` asks (each poll is one short SSH command) and how often it says something at the least.
POLL_S = 2.0
SAY_S = 10.0
# An SSH drop while following a job: reconnect for this long before giving up on following (the job goes on).
RECONNECT_S = 60.0
# The stall detector's second signal: CPU time. A job whose counter stands still but which used this much CPU
# since it last moved is working (an installer writes no progress file; pip is silent while it fetches one big
# wheel); a hung one (a dead mount, a mirror that sends nothing) uses almost none - a progress writer waking
# every 2 s costs ~15 ms in ten minutes.
CPU_WORK_NS = 500 * 1000 * 1000
# A job systemd could not set up (219/CGROUP: seen now and then on a loaded cgroup-v1 host) never ran: started
# again, this many times in all, a short pause between.
SET_UP_TRIES = 3
SET_UP_PAUSE_S = 2.0
ACTIVE = ('active', 'activating', 'deactivating', 'reloading', 'refreshing')


class JobFailed(OperatorError):
    """The job ended without success, or was stopped as stalled; the message is the operator's line."""

    def __init__(self, message, job=None, outcome=None):
        super().__init__(message)
        self.job, self.outcome = job, outcome


class JobDetached(OperatorError):
    """Following the job failed (the connection stayed down); the job itself keeps running."""


@dataclasses.dataclass
class Job:
    name: str                       # gpuhost-<kind>[-<key>]: each start a unit <name>-<start time>.service
    label: str                      # what it does, for messages: "the model download of Qwen@8177ab0"
    spec: str                       # what it does, hashed: a changed declaration is another spec
    interpreter: str                # python3 | bash
    body: str                       # the program the unit runs (not secret: it is a file on the host)
    args: tuple = ()
    stdin: bytes = b''              # the job's input; may carry a secret (a root-only file while it runs)
    vmid: Optional[str] = None      # None: on the host; else in that container, with its own systemd
    limit_s: int = 0                # RuntimeMaxSec; 0: none
    stall_s: int = 600
    limit_key: str = ''             # the config keys naming the limit and the stall time, for messages
    stall_key: str = ''
    prefix: Optional[str] = None    # what progress lines start with (default: the label)

    @property
    def log_path(self) -> str:
        return '%s/%s/log' % (JOBS_DIR, self.name)

    @property
    def where(self) -> str:
        return 'in container %s' % self.vmid if self.vmid is not None else 'on the host'

    def watch_hint(self) -> str:
        prefix = 'pct exec %s -- ' % self.vmid if self.vmid is not None else ''
        return "`%ssystemctl status '%s-*'`, `%stail -f %s`" % (prefix, self.name, prefix, self.log_path)


def spec_of(doc) -> str:
    """A declaration's identity: the sha256 of its canonical JSON (secrets must not be in it)."""
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(',', ':')).encode()).hexdigest()[:32]


def key_of(*parts) -> str:
    """A short stable key for a unit name from what a job works on (a directory, a container)."""
    return hashlib.sha256('\0'.join(str(p) for p in parts).encode()).hexdigest()[:12]


@dataclasses.dataclass
class Poll:
    state: str
    sub: str
    cpu: Optional[int]
    spec: Optional[str]
    started: Optional[int]
    now: Optional[int]
    progress: Optional[dict]
    result: Optional[dict]
    stop: Optional[str]
    out: Optional[str]
    log: list
    stopped_now: bool = False       # `stop` found it running and stopped it
    output: Optional[int] = None    # bytes of its log and stdout so far
    journal: list = dataclasses.field(default_factory=list)  # systemd's words, for a job that left no result

    def not_set_up(self) -> Optional[str]:
        """systemd's exit code (`219/CGROUP`) where it ended the job before its process ran: no result from the
        job's wrapper nor from ExecStopPost, and the journal names one of systemd's own set-up failures (exit
        statuses 200-255, systemd.exec(5)). Nothing of the job ran; starting it again is safe."""
        if self.running or self.result is not None:
            return None
        for line in self.journal:
            m = re.search(r'status=(2[0-5][0-9]/[A-Z_]+)', line)
            if m:
                return m.group(1)
        return None

    @property
    def running(self) -> bool:
        return self.state in ACTIVE


def parse_poll(text: str) -> Poll:
    """job.sh poll's lines (pure; unit-tested)."""
    kv, log, journal = {}, [], []
    for line in text.splitlines():
        key, sep, value = line.partition('\t')
        if not sep:
            continue
        if key in ('log', 'journal'):
            log.append(value)
            if key == 'journal':
                journal.append(value)
        else:
            kv[key] = value

    def opt(k):
        v = kv.get(k)
        return None if v in (None, '', '-', '[not set]') else v

    def num(k):
        v = opt(k)
        return int(v) if v is not None and v.isdigit() else None
    progress = None
    if opt('progress'):
        try:
            progress = json.loads(kv['progress'])
        except ValueError:
            progress = None
    result = None
    if opt('result'):
        parts = kv['result'].split()
        if len(parts) >= 3:
            result = {'service_result': parts[0], 'exit_code': parts[1], 'exit_status': parts[2],
                      'ended': int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else None}
    return Poll(state=kv.get('state', 'unknown'), sub=kv.get('sub', ''), cpu=num('cpu'), spec=opt('spec'),
                started=num('started'), now=num('now'), progress=progress, result=result, stop=opt('stop'),
                out=kv.get('out'), log=log, stopped_now=kv.get('stopped') == 'yes', output=num('output'),
                journal=journal)


def _job_sh() -> str:
    return remote.script('job.sh')


def call(target, job: Job, action: str, *args, stdin: Optional[bytes] = None, client=None) -> remote.Result:
    """One short command of job.sh for this job, on the host or in its container."""
    argv = [action, job.name] + [str(a) for a in args]
    if job.vmid is None:
        return remote.run(target, 'job.sh', argv, stdin=stdin, client=client, check=False)
    return remote.run(target, 'ct_job.sh', [job.vmid, _job_sh()] + argv, stdin=stdin, client=client, check=False)


def _checked(target, job, res, what) -> remote.Result:
    if res.exit_code != 0:
        tail = ' | '.join(res.stderr.strip().splitlines()[-3:]) or '(no output)'
        raise JobFailed('%s: %s %s job %s %s failed (exit %d): %s' % (
            target.name, what, job.label, job.name, job.where, res.exit_code, tail), job)
    return res


def poll(target, job: Job) -> Poll:
    return parse_poll(_checked(target, job, call(target, job, 'poll'), 'polling').stdout)


def stop(target, job: Job, reason: str) -> Poll:
    return parse_poll(_checked(target, job, call(target, job, 'stop', reason), 'stopping').stdout)


def forget(target, job: Job) -> None:
    call(target, job, 'forget')


def start(target, job: Job, say: Callable[[str], None] = info) -> str:
    """Start the job, or re-attach to the one running with the same declaration; a running one of another
    declaration (the config changed under it) is stopped first. Returns 'started' or 'attached'."""
    for attempt in range(2):
        try:
            res = call(target, job, 'start', job.spec, int(job.limit_s or 0), job.interpreter, job.body, *job.args,
                       stdin=job.stdin)
        except remote.ConnectionLost as e:
            # The start may have run: a job it started outlives the connection, and the next run re-attaches to it.
            raise remote.ConnectionLost('%s A job it started keeps running %s; the next `up` re-attaches to it (watch '
                                        'it: %s).' % (e, job.where, job.watch_hint())) from None
        res = _checked(target, job, res, 'starting')
        word = res.stdout.strip().split('\t')[0]
        if word in ('started', 'attached'):
            return word
        if word == 'busy' and attempt == 0:
            say('%s: job %s %s runs an earlier declaration; stopping it first (its partial work is kept)' % (
                job.label, job.name, job.where))
            stop(target, job, 'its declaration changed')
            continue
        raise JobFailed('%s: job %s %s could not be started: %s' % (job.label, job.name, job.where,
                                                                     res.stdout.strip() or res.stderr.strip()), job)
    raise JobFailed('%s: job %s %s is still running an earlier declaration after being stopped' % (
        job.label, job.name, job.where), job)


def describe_progress(p: Optional[dict]) -> str:
    if not p:
        return 'running'
    return str(p.get('line') or p.get('phase') or 'running')


def outcome(job: Job, p: Poll) -> str:
    """Why a job that ended did not succeed, in a few words."""
    r = p.result or {}
    if p.stop:
        return 'stopped (%s)' % p.stop
    sr = r.get('service_result')
    if sr == 'timeout':
        return 'ran longer than its limit of %d s (%s) and was stopped' % (job.limit_s, job.limit_key or 'its limit')
    if sr == 'oom-kill':
        return 'was killed for lack of memory (oom-kill)'
    if r.get('exit_code') == 'killed' or sr == 'signal':
        return 'was killed by SIG%s (a stop, the host shutting down, or a kill)' % r.get('exit_status', '?')
    if r.get('exit_code') == 'exited':
        return 'exited with status %s' % r.get('exit_status')
    return 'ended: %s' % (sr or 'without a result')


def follow(target, job: Job, say: Callable[[str], None] = info, poll_s: float = POLL_S, say_s: float = SAY_S,
           reconnect_s: float = RECONNECT_S) -> Poll:
    """Poll the job until it ends; progress lines at least every say_s; the stall detector. Returns the final
    poll of a job that succeeded; raises JobFailed (ended badly, or stalled and stopped) or JobDetached."""
    last_said = 0.0
    mark_counter, mark_cpu, last_change = None, None, time.monotonic()
    lost_since = None
    settled = 0
    while True:
        if CANCELLED.is_set():
            raise JobDetached('%s: the run was interrupted (Ctrl-C) while following job %s %s; the job keeps running '
                              '- the next `up` re-attaches to it (watch it: %s)' % (
                                  job.label, job.name, job.where, job.watch_hint()))
        try:
            p = poll(target, job)
            lost_since = None
        except remote.ConnectionLost as e:
            now = time.monotonic()
            lost_since = lost_since or now
            if now - lost_since > reconnect_s:
                raise JobDetached('%s: lost the connection while following job %s %s (%s); the job keeps running '
                                  '%s - the next `up` re-attaches to it (watch it: %s)' % (
                                      job.label, job.name, job.where, str(e).split(';')[0], job.where,
                                      job.watch_hint())) from None
            CANCELLED.wait(min(poll_s * 2, 5.0))
            continue
        now = time.monotonic()
        # 'unknown': systemd did not answer (a loaded host) - neither running nor ended; asked again below, and
        # the stall detector goes on counting.
        if not p.running and p.state != 'unknown':
            if p.spec is None:
                raise JobFailed('%s: job %s %s is gone without a result (its directory %s/%s is missing)' % (
                    job.label, job.name, job.where, JOBS_DIR, job.name), job)
            if p.result is None and settled < 5:
                settled += 1        # the outcome is written by ExecStopPost: give a loaded host a moment
                CANCELLED.wait(1.0)
                continue
            return p
        # Moving: its own counter, or (a job that writes none, an installer) its output growing; or CPU time where
        # the host accounts it (cgroup v2; a v1 host says "[not set]").
        counter = ((p.progress or {}).get('counter'), p.output)
        worked = p.cpu is not None and (mark_cpu is None or p.cpu - mark_cpu >= CPU_WORK_NS)
        if counter != mark_counter or worked:
            mark_counter, mark_cpu, last_change = counter, p.cpu, now
        elif job.stall_s and now - last_change > job.stall_s:
            line = describe_progress(p.progress)
            stop(target, job, 'no progress for %d s' % job.stall_s)
            raise JobFailed('%s: job %s %s made no progress for %d s (%s) and was stopped; last: %s. What it did is '
                            'kept for the next attempt; its log: %s' % (
                                job.label, job.name, job.where, job.stall_s, job.stall_key or 'its stall limit',
                                line, job.log_path), job, 'stalled')
        if now - last_said >= say_s:
            last_said = now
            say('%s: %s' % (job.prefix or job.label, describe_progress(p.progress)))
        CANCELLED.wait(poll_s)


def run(target, job: Job, say: Callable[[str], None] = info, **kw) -> Poll:
    """Start (or re-attach to) the job and follow it to its end. Returns the final poll (p.out: the last line
    of its stdout); a job that did not succeed raises JobFailed with its outcome and log tail. A job systemd
    ended before its process ran (Poll.not_set_up) is started again, up to SET_UP_TRIES in all."""
    for attempt in range(1, SET_UP_TRIES + 1):
        how = start(target, job, say)
        if how == 'attached':
            say('%s: re-attached to job %s, still running %s (started by an earlier `up`)' % (
                job.label, job.name, job.where))
        p = follow(target, job, say, **kw)
        code = p.not_set_up()
        if code is None or attempt == SET_UP_TRIES:
            break
        say('%s: systemd could not set up job %s %s (%s), nothing of it ran; starting it again (%d of %d)' % (
            job.label, job.name, job.where, code, attempt + 1, SET_UP_TRIES))
        CANCELLED.wait(SET_UP_PAUSE_S)
    r = p.result or {}
    if r.get('service_result') == 'success' and r.get('exit_code') == 'exited' and r.get('exit_status') == '0' \
            and not p.stop:
        return p
    raise JobFailed('%s: job %s %s %s%s; its log: %s' % (
        job.label, job.name, job.where, outcome(job, p),
        ': ' + ' | '.join(p.log[-3:]) if p.log else '', job.log_path), job, p)
