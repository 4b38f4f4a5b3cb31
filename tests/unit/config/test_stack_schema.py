"""docs/config.schema.json is the model's schema as generated; docs/stack.schema.json validates Pulumi.<stack>.yaml
files as written (namespaced keys, secure: values): both committed stacks pass, and the mistakes an editor or CI
should catch fail."""

import copy
import json
import os

import jsonschema
import pytest
import yaml

import config
from tests.lablib import REPO


def schema():
    with open(os.path.join(REPO, 'docs', 'stack.schema.json')) as f:
        return json.load(f)


def stack(name):
    with open(os.path.join(REPO, 'Pulumi.%s.yaml' % name)) as f:
        return yaml.safe_load(f)


def test_the_committed_schema_is_the_generated_one():
    assert schema() == json.loads(json.dumps(config.stack_schema())), 'run: python -m config stack-schema > docs/stack.schema.json'


def test_the_committed_model_schema_is_the_generated_one():
    # docs/config.schema.json: the model's schema (every gpuhost: key, its type, default and description), what an
    # editor or a reviewer reads for one host's config.
    with open(os.path.join(REPO, 'docs', 'config.schema.json')) as f:
        committed = json.load(f)
    assert committed == json.loads(json.dumps(config.Deployment.model_json_schema())), \
        'docs/config.schema.json is not the model\'s schema: run python -m config schema > docs/config.schema.json'


@pytest.mark.parametrize('name', ['lab', 'prod'])
def test_both_stacks_validate(name):
    jsonschema.validate(stack(name), schema())


@pytest.mark.parametrize('edit,where', [
    (lambda c: c.__setitem__('gpuhots:vm', c.pop('gpuhost:vm')), 'gpuhots:vm'),
    (lambda c: c['gpuhost:sglang'].__setitem__('port', '30000'), 'port'),
    (lambda c: c['gpuhost:container'].__setitem__('cpus', 8), 'cpus'),
    (lambda c: c['gpuhost:container'].__setitem__('onboot', 'yes'), 'onboot'),
    (lambda c: c.pop('gpuhost:container'), 'gpuhost:container'),
])
def test_a_broken_stack_does_not(edit, where):
    doc = copy.deepcopy(stack('prod'))
    edit(doc['config'])
    with pytest.raises(jsonschema.ValidationError) as e:
        jsonschema.validate(doc, schema())
    assert where in str(e.value)


def test_a_fleet_stack_validates_and_its_host_entries_are_checked():
    from lab import fleet
    entries = [fleet.host_entry(i, fleet.host_spec(i, fleet.addresses(i)), '.lab-fleet/gpu%02d' % i)
               for i in (1, 2, 3, 4)]
    doc = {'config': fleet.stack_config(entries)}
    jsonschema.validate(doc, schema())
    doc['config']['gpuhost:hosts'][1]['sglnag'] = {}
    with pytest.raises(jsonschema.ValidationError, match='sglnag'):
        jsonschema.validate(doc, schema())
    doc['config']['gpuhost:hosts'][1] = {'host': {}}
    with pytest.raises(jsonschema.ValidationError, match="'name' is a required property"):
        jsonschema.validate(doc, schema())
