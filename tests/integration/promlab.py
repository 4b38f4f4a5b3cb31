"""Monitoring against a lab, as docs/monitoring.md's "Monitoring" wires it up: the stack's prometheus_file_sd output
written
to the file Prometheus' file_sd reads, Debian's node_exporter reading the simulated host's textfile directory
(the host's /var through its root, on the host's address), a real Prometheus (Debian's) scraping both with
the rules `make monitoring` renders - every second, so the tests wait seconds, not minutes. Shared by
test_monitoring.py and test_collector.py; each module starts one and keeps it for all its tests."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

from tools import monitoring as tool

SCRAPE_S = 1        # the test Prometheus' scrape and evaluation interval


def net_of(lab):
    return int(lab.spec['addresses']['ssh'].split('.')[2])


def port_free(addr, port):
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait(fn, timeout, what, interval=0.2):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except OSError as e:
            last = e
        time.sleep(interval)
    raise AssertionError('timed out after %d s waiting for %s (last: %r)' % (timeout, what, last))


class Prometheus(object):
    def __init__(self, url):
        self.url = url

    def api(self, path, **params):
        with urllib.request.urlopen('%s/api/v1/%s?%s' % (self.url, path, urllib.parse.urlencode(params)),
                                    timeout=10) as r:
            doc = json.loads(r.read())
        assert doc['status'] == 'success', doc
        return doc['data']

    def query(self, expr):
        data = self.api('query', query=expr)
        return data['result']

    def value(self, expr):
        res = self.query(expr)
        return float(res[0]['value'][1]) if res else None

    def alerts(self, state=None):
        return {a['labels']['alertname'] for a in self.api('alerts')['alerts'] if state in (None, a['state'])}

    def firing(self, name, **labels):
        """The firing alerts called name whose labels include these."""
        return [a for a in self.api('alerts')['alerts'] if a['labels']['alertname'] == name and a['state'] == 'firing'
                and all(a['labels'].get(k) == v for k, v in labels.items())]


@contextlib.contextmanager
def monitoring(lab, stack, tmp):
    """node_exporter and Prometheus for the deployed stack; yields (Prometheus, the Deployment)."""
    net = net_of(lab)
    host_addr, prom_addr = lab.spec['addresses']['ssh'], '127.0.%d.6' % net
    if not port_free(host_addr, 9100):
        pytest.fail('port 9100 on %s is taken (a system node_exporter listening on all addresses?); the lab '
                    'runs its own on the host\'s address' % host_addr)
    for tool_name in ('prometheus', 'prometheus-node-exporter', 'promtool'):
        if shutil.which(tool_name) is None:
            pytest.fail('%s is missing: apt-get install -y prometheus prometheus-node-exporter' % tool_name)
    # As docs/monitoring.md says: the output into the file Prometheus' file_sd_configs reads.
    targets = tmp / 'targets.json'
    subprocess.run('pulumi stack output prometheus_file_sd --json --stack %s > %s' % (stack, targets), shell=True,
                   cwd=lab.project, env=lab.env, check=True)
    d = tool.load(stack, lab.project)
    for name, content in tool.files(stack, d).items():
        (tmp / name).write_text(content)
    cfg = yaml.safe_load((tmp / tool.SCRAPE).read_text())
    cfg['global'] = {'scrape_interval': '%ds' % SCRAPE_S, 'evaluation_interval': '%ds' % SCRAPE_S}
    cfg['rule_files'] = [str(tmp / tool.RULES)]
    job = cfg['scrape_configs'][0]
    job['scrape_interval'] = '%ds' % SCRAPE_S
    job['file_sd_configs'] = [{'files': [str(targets)], 'refresh_interval': '1s'}]
    (tmp / 'prometheus-test.yml').write_text(yaml.safe_dump(cfg))
    assert subprocess.run(['promtool', 'check', 'config', str(tmp / 'prometheus-test.yml')],
                          capture_output=True).returncode == 0

    # The host's textfile directory as the host sees it (its /var), through its systemd's root.
    textfiles = '/proc/%d/root/var/lib/prometheus/node-exporter' % lab.machine().leader()
    procs = []
    try:
        # node_exporter as on the host, on its address (the host shares the machine's network): Debian's, the
        # machine's binary - the host's base has no node_exporter.
        procs.append(subprocess.Popen(
            ['prometheus-node-exporter', '--collector.disable-defaults', '--collector.textfile',
             '--collector.textfile.directory=%s' % textfiles, '--web.listen-address=%s:9100' % host_addr],
            stdout=subprocess.DEVNULL, stderr=open(str(tmp / 'node-exporter.log'), 'w'), start_new_session=True))
        procs.append(subprocess.Popen(
            ['prometheus', '--config.file=%s' % (tmp / 'prometheus-test.yml'), '--storage.tsdb.path=%s' % (tmp / 'data'),
             '--web.listen-address=%s:9090' % prom_addr], stdout=subprocess.DEVNULL,
            stderr=open(str(tmp / 'prometheus.log'), 'w'), start_new_session=True))
        prom = Prometheus('http://%s:9090' % prom_addr)
        wait(lambda: urllib.request.urlopen(prom.url + '/-/ready', timeout=2).status == 200, 60, 'Prometheus ready')
        yield prom, d
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
