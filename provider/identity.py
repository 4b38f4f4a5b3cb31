"""What a process forked by the plugin's zygote inherits from the zygote rather than from the stub that asked for it
(issue 58; standard library only: provider/stub.py imports it).

A pass's serving process forked by the zygote (provider/__main__.py zygote) gets the zygote's namespaces, cgroup,
credentials, resource limits and scheduling, not its stub's: a stub in another network namespace (`unshare -n`, a
container) got a serving process that listened on the zygote's loopback, which its engine could not reach; a CI
job's or systemd scope's cgroup (its limits, its kill-on-stop), a `nice` or a `ulimit` were lost the same way. So the
stub keys its zygote by its own identity (provider/stub.py _zygote_path) and the zygote forks only for a peer whose
identity, read from /proc/<peer pid>, is its own - anything else is answered `other`, and the stub starts a serving
process the plain way. Both sides read it here, from a /proc/<pid> directory: ~0.1 ms, a dozen small reads."""

import os

# The lines of /proc/<pid>/status a fork inherits: credentials (real, effective, saved, filesystem ids; supplementary
# groups), capabilities, no_new_privs and seccomp, CPU and memory node affinity.
STATUS = ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp',
          'Seccomp_filters', 'Cpus_allowed_list', 'Mems_allowed_list')


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def of(proc: str) -> str:
    """The identity of the process of a /proc/<pid> directory ('/proc/self' for this one): every namespace (each
    /proc/<pid>/ns/* link, the *_for_children ones too), root directory, cgroup, credentials, capabilities, resource
    limits, nice level, scheduling policy and priority, and OOM score adjustment. OSError when any is unreadable."""
    ns = os.path.join(proc, 'ns')
    parts = ['ns ' + ' '.join(sorted(os.readlink(os.path.join(ns, name)) for name in os.listdir(ns))),
             'root ' + os.readlink(os.path.join(proc, 'root')),
             'cgroup ' + _read(os.path.join(proc, 'cgroup'))]
    status = dict(line.partition(':')[::2] for line in _read(os.path.join(proc, 'status')).splitlines())
    parts += ['%s %s' % (key, ' '.join(status[key].split())) for key in STATUS if key in status]
    if 'Uid' not in status or 'Gid' not in status:
        raise OSError('%s/status: no Uid or Gid' % proc)
    # Fields 19 (nice), 40 (rt_priority) and 41 (policy) of stat, counted from 1: after the ')' that ends the name,
    # field 3 is the first.
    stat = _read(os.path.join(proc, 'stat')).rpartition(')')[2].split()
    if len(stat) < 39:
        raise OSError('%s/stat: %d fields' % (proc, len(stat) + 2))
    parts += ['nice %s rt_priority %s policy %s' % (stat[16], stat[37], stat[38]),
              'oom_score_adj ' + _read(os.path.join(proc, 'oom_score_adj')).strip(),
              'limits ' + _read(os.path.join(proc, 'limits'))]
    return '\n'.join(parts)
