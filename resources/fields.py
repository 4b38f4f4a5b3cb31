"""The properties of the plugin's resources, declared on the class that serves each type (provider/registry.py):

    INPUTS = {'path': S, 'mode': S, 'token': secret(optional(S)), 'rollout': optional(ROLLOUT), ...}
    OUTPUTS = {'sha256': S, 'report': ANY}     # the facts it reports besides its inputs (placeholders in the program)

A type is one of the Pulumi package schema's: S (string), I (integer), N (number), B (boolean), ANY (a free-form
document), arr(items), mapof(values) (an object of any keys), obj('Name', key=type, ...) (an object type of the
package, gpuhost:index:Name). An input is required unless optional(); secret() marks one the program hands over as
a Pulumi secret (the engine keeps the output of the same name secret). A class's REPLACE keys are its
replaceOnChanges.

tools/provider_schema.py writes provider/schema.json from these; tests/unit/test_provider_schema.py runs the
program under mocks and checks every input it registers against them (problems())."""

from __future__ import annotations

import dataclasses

PACKAGE = 'gpuhost'   # provider/registry.py's (the floor above: nothing here imports it)


@dataclasses.dataclass(frozen=True)
class Type:
    kind: str                     # string, integer, number, boolean, any, array, map, object
    of: Type | None = None        # an array's items, a map's values
    name: str | None = None       # an object type's name
    fields: tuple = ()            # an object type's (key, Type) pairs
    optional: bool = False
    secret: bool = False

    def spec(self) -> dict:
        """The type as a property of the schema has it (an object type by reference)."""
        if self.kind == 'any':
            return {'$ref': 'pulumi.json#/Any'}
        if self.kind == 'object':
            return {'$ref': '#/types/%s' % self.token()}
        if self.kind == 'array':
            return {'type': 'array', 'items': self.of.spec()}
        if self.kind == 'map':
            return {'type': 'object', 'additionalProperties': self.of.spec()}
        return {'type': self.kind}

    def token(self) -> str:
        return '%s:index:%s' % (PACKAGE, self.name)

    def objects(self):
        """The object types this type names, itself included, nested ones first."""
        if self.of is not None:
            yield from self.of.objects()
        for _, t in self.fields:
            yield from t.objects()
        if self.kind == 'object':
            yield self


S, I, N, B, ANY = Type('string'), Type('integer'), Type('number'), Type('boolean'), Type('any')


def arr(items: Type) -> Type:
    return Type('array', of=items)


def mapof(values: Type) -> Type:
    return Type('map', of=values)


def obj(name: str, /, **fields: Type) -> Type:
    return Type('object', name=name, fields=tuple(fields.items()))


def optional(t: Type) -> Type:
    return dataclasses.replace(t, optional=True)


def secret(t: Type) -> Type:
    return dataclasses.replace(t, secret=True)


# ------------------------------------------------------------------ shapes several resources share

# A fleet's host: its place in the rollout (config/fleet.py rollout_info; provider/rollout.py gates on it).
# fleet_lock: gpuhost:rollout.fleet_lock without its password (that is the provider's configuration: provider/rollout.py).
ROLLOUT = obj('Rollout', host=S, order=arr(S), before=arr(S), after=arr(S), max_unavailable=I, canary=optional(S),
              fleet_lock=optional(obj('FleetLock', group=S, slots=I, endpoints=arr(S), ttl_s=I, user=optional(S),
                                      ca_file=optional(S), cert_file=optional(S), key_file=optional(S))))
# Where the SGLang service is and how long it may take to start (resources/sglang.py service_props).
SERVICE = obj('Service', vmid=I, unit_name=S, unit_path=S, venv=S, version=S, endpoint=S, health_timeout=N)


# ------------------------------------------------------------------ checking values against them

def problems(props: dict, declared: dict) -> list:
    """What in a resource's inputs (as the engine hands them over: numbers as floats, secrets wrapped) does not
    match its declaration: an input not declared, a required one missing, a value of another type, a secret one in
    plain text. One line each, naming the key and the type, never the value (it may be a secret)."""
    out = ['%s: not declared' % k for k in sorted(set(props) - set(declared))]
    for key, t in declared.items():
        value = props.get(key)
        if value is None:
            if not t.optional:
                out.append('%s: required, not set' % key)
            continue
        if t.secret and not _is_secret(value):
            out.append('%s: declared secret, handed over in plain text' % key)
        out += value_problems(value, t, key)
    return out


def value_problems(value, t: Type, where: str) -> list:
    """How `value` differs from `t` at any depth. A null is every type's (Pulumi has no other absent value; under
    the unit tests' mocks, what another resource reports is null)."""
    if _is_secret(value):
        value = value.get('value')
    if value is None or t.kind == 'any':
        return []
    wrong = ['%s: %s expected, got %s' % (where, t.kind, type(value).__name__)]
    if t.kind == 'string':
        return [] if isinstance(value, str) else wrong
    if t.kind == 'boolean':
        return [] if isinstance(value, bool) else wrong
    if t.kind in ('integer', 'number'):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return wrong
        integral = isinstance(value, int) or value.is_integer()
        return [] if t.kind == 'number' or integral else ['%s: integer expected, got a fraction' % where]
    if t.kind == 'array':
        if not isinstance(value, list):
            return wrong
        return [p for i, v in enumerate(value) for p in value_problems(v, t.of, '%s[%d]' % (where, i))]
    if not isinstance(value, dict):
        return wrong
    if t.kind == 'map':
        return [p for k, v in value.items() for p in value_problems(v, t.of, '%s.%s' % (where, k))]
    fields = dict(t.fields)
    out = ['%s.%s: not a field of %s' % (where, k, t.name) for k in sorted(set(value) - set(fields))]
    for k, ft in t.fields:
        if value.get(k) is None:
            if not ft.optional:
                out.append('%s.%s: required field of %s, not set' % (where, k, t.name))
            continue
        out += value_problems(value[k], ft, '%s.%s' % (where, k))
    return out


def _is_secret(value) -> bool:
    from pulumi.runtime import rpc
    return rpc.is_rpc_secret(value)
