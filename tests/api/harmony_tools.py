#!/usr/bin/env python3
"""Constrained tool calls and structured answers of a GPT-OSS (harmony) model
through the OpenAI and Anthropic APIs, checked with an independent validator.

  harmony_tools.py PORT

Sends, at temperature 1 with several seeds, chats with strict tools and
tool_choice required / a named function / auto (OpenAI) and any / tool
(Anthropic), and chats with response_format json_schema (default reasoning
budget, and thinking_token_budget 0 and 5 with a smaller max_tokens). Every
tool call that comes back must name an allowed tool and its arguments must
parse and validate against that tool's schema (jsonschema, Draft 2020-12);
every final answer of a structured reply must validate against the
response schema. The reasoning budget (half of max_tokens unless the
request sets one) closes a random model's analysis channel, and the
schemas' answers are short, so every reply that must call a tool ends with
a call and every structured reply finishes ("stop"), none cut by
max_tokens; only `auto` (whose final answer is free text) may run to the
limit. At least MIN_CALLS calls must have come back.
Prints each failure; exits 1 if there is one.
"""
import json
import sys
import urllib.request

import jsonschema

MIN_CALLS = 6
# Tokens left after the reasoning for a call's header and arguments or a
# structured answer: a random model pads JSON with whitespace (up to 8 bytes
# at each of ~30 places in a 'plan' of three steps, often a token a byte).
ROOM_FOR_ARGS = 300
SEEDS = range(6)

SCHEMAS = {
    'read_file': {
        'type': 'object',
        'properties': {
            'path': {'type': 'string', 'pattern': '^/[a-z]{1,6}\\.md$'},
            'lines': {'type': 'integer', 'minimum': 1, 'maximum': 99},
        },
        'required': ['path', 'lines'],
        'additionalProperties': False,
    },
    'ask': {
        'type': 'object',
        'properties': {'q': {'enum': ['yes', 'no']}},
        'required': ['q'],
        'additionalProperties': False,
    },
    'plan': {
        'type': 'object',
        'properties': {
            'steps': {
                'type': 'array', 'minItems': 1, 'maxItems': 3,
                'items': {'$ref': '#/$defs/step'},
            },
            'note': {'anyOf': [{'type': 'string', 'maxLength': 12}, {'type': 'null'}]},
        },
        'required': ['steps'],
        'additionalProperties': False,
        '$defs': {
            'step': {
                'type': 'object',
                'properties': {'n': {'type': 'integer', 'minimum': 0, 'maximum': 9},
                               'done': {'type': 'boolean'}},
                'required': ['n', 'done'],
                'additionalProperties': False,
            },
        },
    },
}


def post(port, path, body):
    req = urllib.request.Request(
        'http://127.0.0.1:%d%s' % (port, path), data=json.dumps(body).encode(),
        headers={'content-type': 'application/json', 'x-api-key': 'k',
                 'anthropic-version': '2023-06-01'})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def check(errors, name, args, allowed, where):
    if name not in allowed:
        errors.append('%s: tool %r is not one of %s' % (where, name, allowed))
        return
    try:
        jsonschema.Draft202012Validator(SCHEMAS[name]).validate(args)
    except jsonschema.ValidationError as e:
        errors.append('%s: %s arguments %r: %s' % (where, name, args, e.message))


def main(port):
    errors, calls, answers = [], 0, 0
    ids = {}  # every call id seen -> where: ids must never repeat across replies
    messages = [{'role': 'user', 'content': 'Use a tool.'}]
    openai_tools = [{'type': 'function',
                     'function': {'name': n, 'parameters': s, 'strict': True}}
                    for n, s in SCHEMAS.items()]
    anthropic_tools = [{'name': n, 'input_schema': s} for n, s in SCHEMAS.items()]
    openai_choices = [('required', list(SCHEMAS)),
                      ({'type': 'function', 'function': {'name': 'plan'}}, ['plan']),
                      ('auto', list(SCHEMAS))]
    anthropic_choices = [({'type': 'any'}, list(SCHEMAS)),
                         ({'type': 'tool', 'name': 'read_file'}, ['read_file'])]
    for seed in SEEDS:
        for choice, allowed in openai_choices:
            where = 'openai %s seed %d' % (json.dumps(choice), seed)
            body = {'model': 'm', 'messages': messages, 'tools': openai_tools,
                    'tool_choice': choice, 'temperature': 1, 'seed': seed,
                    'max_tokens': ROOM_FOR_ARGS * 2}  # the default budget: half
            if seed % 2:
                body['thinking_token_budget'] = 30
                body['max_tokens'] = 30 + ROOM_FOR_ARGS
                where += ' budget 30'
            r = post(port, '/v1/chat/completions', body)
            c = r['choices'][0]
            tcs = c['message'].get('tool_calls') or []
            if c['finish_reason'] == 'tool_calls' and not tcs:
                errors.append('%s: finish_reason tool_calls without calls' % where)
            if choice != 'auto' and c['finish_reason'] != 'tool_calls':
                errors.append('%s: a required call ended without one: %r' % (where, c))
            for tc in tcs:
                calls += 1
                if tc['id'] in ids:
                    errors.append('%s: call id %s repeats %s' % (where, tc['id'], ids[tc['id']]))
                ids[tc['id']] = where
                try:
                    args = json.loads(tc['function']['arguments'])
                except ValueError as e:
                    errors.append('%s: arguments do not parse: %s' % (where, e))
                    continue
                check(errors, tc['function']['name'], args, allowed, where)
        for choice, allowed in anthropic_choices:
            where = 'anthropic %s seed %d' % (json.dumps(choice), seed)
            body = {'model': 'm', 'messages': messages, 'tools': anthropic_tools,
                    'tool_choice': choice, 'temperature': 1, 'max_tokens': ROOM_FOR_ARGS * 2}
            if seed % 2:  # extended thinking's budget bounds the reasoning
                body['thinking'] = {'type': 'enabled', 'budget_tokens': 12}
                body['max_tokens'] = 12 + ROOM_FOR_ARGS
                where += ' thinking budget 12'
            r = post(port, '/v1/messages', body)
            uses = [b for b in r['content'] if b['type'] == 'tool_use']
            if r['stop_reason'] != 'tool_use':
                errors.append('%s: a required call ended without one: %r' % (where, r))
            for b in uses:
                calls += 1
                if b['id'] in ids:
                    errors.append('%s: call id %s repeats %s' % (where, b['id'], ids[b['id']]))
                ids[b['id']] = where
                check(errors, b['name'], b['input'], allowed, where)
        for (name, schema), (budget, max_tokens) in zip(
                SCHEMAS.items(), [(0, 60), (5, 60), (None, ROOM_FOR_ARGS * 2)]):
            where = 'response_format %s seed %d budget %s' % (name, seed, budget)
            body = {'model': 'm', 'messages': [{'role': 'user', 'content': 'JSON please.'}],
                    'response_format': {'type': 'json_schema',
                                        'json_schema': {'name': name, 'schema': schema,
                                                        'strict': True}},
                    'temperature': 1, 'seed': seed, 'max_tokens': max_tokens}
            if budget is not None:
                body['thinking_token_budget'] = budget
            r = post(port, '/v1/chat/completions', body)
            c = r['choices'][0]
            if c['finish_reason'] != 'stop':
                errors.append('%s: the structured answer did not finish: %r' % (where, c))
                continue
            answers += 1
            try:
                jsonschema.Draft202012Validator(schema).validate(
                    json.loads(c['message']['content']))
            except (ValueError, jsonschema.ValidationError) as e:
                errors.append('%s: %r: %s' % (where, c['message']['content'], e))
    for e in errors:
        print(e)
    print('%d tool calls, %d structured answers, %d invalid' % (calls, answers, len(errors)))
    if calls < MIN_CALLS:
        print('too few tool calls came back (%d < %d)' % (calls, MIN_CALLS))
        return 1
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main(int(sys.argv[1])))
