#!/usr/bin/env python3
"""Validates constrained outputs with an independent validator (jsonschema).

  validate_structured.py FILE

FILE holds a JSON list of {"schema": ..., "output": "..."}; every output must
parse as JSON and validate against its schema (Draft 2020-12). Prints each
failure and exits 1 if there is one, 0 otherwise.
"""
import json
import sys

import jsonschema


def main(path):
    cases = json.load(open(path, encoding='utf-8'))
    bad = 0
    for i, c in enumerate(cases):
        try:
            value = json.loads(c['output'])
            jsonschema.Draft202012Validator(c['schema']).validate(value)
        except Exception as e:  # any failure is reported the same way
            bad += 1
            print('case %d: %s\n  schema: %s\n  output: %r' %
                  (i, e, json.dumps(c['schema']), c['output']))
    print('%d outputs, %d invalid' % (len(cases), bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1]))
