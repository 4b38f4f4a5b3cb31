"""gpuhost-safety: the host's safety rules as a Pulumi policy pack (CrossGuard), mandatory by default.

    pulumi preview --policy-pack policy [--policy-pack-config policy/config.<stack>.json]

Runs in the project's virtualenv (PulumiPolicy.yaml: virtualenv ../.venv) with the project root on
sys.path, so the rules use the program's own kernel command-line semantics (grammar/cmdline.py),
SGLang's flag parser (grammar/sglang_argparse.py) and systemd's unit grammar (grammar/systemd_unit.py).
The rules themselves are in gpuhost_rules.py (pure functions, unit-tested).

A stack's policy config may lower a rule to advisory (its findings then print as warnings) and may
opt in to a public SGLang bind; it may not disable a rule, change the reporter, or name a rule this
pack does not have - such a config is refused when the pack is configured, before any resource is
judged. Whatever is relaxed is printed on every run by the advisory `relaxed-rules` policy.
"""

import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (HERE, ROOT):
    if p not in sys.path:
        sys.path.insert(0, p)

import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from pulumi_policy import (EnforcementLevel, PolicyConfigSchema, PolicyPack,  # noqa: E402
                           ResourceValidationPolicy)
from pulumi_policy import policy as _policy  # noqa: E402
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, _is_unknown  # noqa: E402
from pulumi_policy.secret import Secret  # noqa: E402

import gpuhost_rules as rules  # noqa: E402

PACK = 'gpuhost-safety'
REPORTER = 'relaxed-rules'
STACK_TYPE = 'pulumi:pulumi:Stack'

# What the engine configured (Configure): every policy's effective level and config properties.
_configured = {'levels': {}, 'configs': {}}
_registry = rules.Registry()
_lock = threading.Lock()


# --------------------------------------------------------------------------- configuration

_original_configure = _policy._PolicyAnalyzerServicer.Configure


def _configure(self, request, context):
    """The engine's Configure call carries the reconciled config of every policy (defaults, then the
    --policy-pack-config file). Record it for the reporter; refuse what may not be relaxed."""
    levels, configs = {}, {}
    for name in request.policyConfig:
        value = request.policyConfig[name]
        levels[name] = self._convert_enforcement_level(value.enforcementLevel).value
        configs[name] = json_format.MessageToDict(value.properties)
    problems = rules.level_problems(levels, configs, REPORTER)
    if problems:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, 'policy pack %s: the policy config is refused: %s' % (
            PACK, '; '.join(problems)))
    with _lock:
        _configured['levels'], _configured['configs'] = levels, configs
    return _original_configure(self, request, context)


# Pinned pulumi-policy (requirements.txt): Configure(self, request, context) of its analyzer servicer.
_policy._PolicyAnalyzerServicer.Configure = _configure


# --------------------------------------------------------------------------- inputs

def plain(value):
    """pulumi-policy's read-only proxies -> plain dicts and lists; unknown values -> rules.UNKNOWN.
    Secrets arrive unwrapped (their values are never put in a message)."""
    if isinstance(value, Secret):
        value = value.value
    if type(value).__name__ in ('_DictProxy', '_ListProxy', '_DictSecretsProxy', '_ListSecretsProxy'):
        value = value['__target']
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, str) and _is_unknown(value):
        return rules.UNKNOWN
    return value


def inputs(args) -> dict:
    """A resource's inputs as the rules read them: a gpuhost resource's with its host's `connection` and `api`,
    which its provider instance's configuration holds (resources/state.py host_provider) - the way a dynamic
    resource of an older release carried them itself. They are what the plugin uses for every call (its Check
    drops a resource's own `connection`/`api` input), so they are what the rules judge."""
    props = plain(args.props)
    provider = getattr(args, 'provider', None)
    if isinstance(props, dict) and provider is not None and provider.resource_type == 'pulumi:providers:gpuhost':
        config = plain(provider.props) or {}
        for key in ('connection', 'api'):
            if key in config:
                props[key] = config[key]
    return props


def _validator(rule):
    def validate(args, report_violation):
        res = rules.Res(args.resource_type, args.name, args.urn, inputs(args))
        if not res.kind:
            return
        try:
            findings = rules.check(rule, res, _registry, args.get_config() or {})
        except rules.Unknown as e:
            # pulumi-policy reports it as "can't run policy ... during preview" (advisory); `up` judges it.
            raise UnknownValueError(UNKNOWN_STRING_VALUE, e.path) from None
        except Exception as e:  # noqa: BLE001 - fail closed, and never echo inputs (secrets) in the message
            findings = ['%s: the rule could not judge this resource (%s in the policy pack); treating it as a '
                        'violation. Fix the input or the pack (policy/gpuhost_rules.py)' % (
                            args.name, type(e).__name__)]
        for message in findings:
            report_violation(message)
    return validate


def _report_relaxed(args, report_violation):
    if args.resource_type != STACK_TYPE:
        return
    with _lock:
        line = rules.level_report(_configured['levels'], _configured['configs'], os.environ.get('PULUMI_STACK', ''))
    if line:
        report_violation(line)


def _schema(rule):
    props = rules.CONFIG_SCHEMAS.get(rule)
    return PolicyConfigSchema(properties=props) if props else None


POLICIES = [ResourceValidationPolicy(name=rule, description=rules.DESCRIPTIONS[rule], validate=_validator(rule),
                                     config_schema=_schema(rule))
            for rule in rules.RULES]
POLICIES.append(ResourceValidationPolicy(
    name=REPORTER, enforcement_level=EnforcementLevel.ADVISORY, validate=_report_relaxed,
    description='Reports which safety rules this stack\'s policy config lowers to advisory or opts out of '
                '(printed on every run; it never blocks).'))

PolicyPack(name=PACK, enforcement_level=EnforcementLevel.MANDATORY, policies=POLICIES)
