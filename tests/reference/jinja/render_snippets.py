"""Renders small Jinja snippets with Python jinja2 (configured like transformers)
and prints a JSON list of {template, context, output|error}. The C++ test
renders the same snippets and compares byte for byte; nothing here states an
expected output by hand."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_env  # noqa: E402

CTX = {
    "s": "  Hello, World!  ",
    "u": "héllo wörld — 中文 🎉",
    "n": 7,
    "f": 2.5,
    "neg": -3,
    "big": 1e20,
    "small": 1.5e-7,
    "t": True,
    "nil": None,
    "lst": [3, 1, 2],
    "words": ["banana", "Apple", "cherry", "apple"],
    "d": {"b": 1, "a": [1, 2.0, "x"], "c": {"z": None, "y": True}},
    "msgs": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo", "extra": 1},
    ],
    "esc": "quote ' and \" and \\ and \n newline \t tab \x01",
    "nested": [[1, 2], [3, 4]],
}

SNIPPETS = [
    # Output and stringification.
    "{{ n }}|{{ f }}|{{ neg }}|{{ big }}|{{ small }}|{{ t }}|{{ nil }}|{{ missing }}",
    "{{ lst }}|{{ words }}|{{ d }}|{{ msgs[2] }}|{{ (1, 'a') }}|{{ (1,) }}",
    "{{ esc }}|{{ [esc] }}|{{ {'k': esc} }}",
    "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 10/2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ missing }} {{ 'ab' * 3 }} {{ [1] + [2] }}",
    "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1,2] < [1,3] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}",
    "{{ 'ell' in 'hello' }} {{ 2 in lst }} {{ 'b' in d }} {{ 'z' not in d }} {{ 'x' in missing }}",
    "{{ not t }} {{ t and n }} {{ nil or 'dflt' }} {{ 0 or '' }} {{ n if t else 'no' }} [{{ n if nil }}]",
    "{{ -n }} {{ +f }} {{ -lst|length }} {{ -1|abs }}",
    # Whitespace control.
    "a  \n  {% if t %}  \n  yes  \n  {% endif %}  \nb",
    "a  \n  {%- if t -%}  \n  yes  \n  {%- endif -%}  \nb",
    "  {%+ if t %}x{% endif %}\n  {{ n }}  \n  {# comment #}\n  end",
    "{% for i in lst %}\n  {{ i }}\n{% endfor %}\n",
    "{% for i in lst -%}\n  {{ i }}\n{%- endfor %}",
    "x {#- c -#} y {# c #}\nz",
    "{% raw %}{{ not rendered }}{% endraw %}",
    "line1\r\nline2\rline3\n",
    "  {% if t %}\n\tindented\n  {% endif %}\n",
    "{{ n }}  {% if t %}x{% endif %}  \n  {% if t %}y{% endif %}\n",
    "{% if t %}\n    {{ n }}\n{% endif %}\n    {# c #}\n  {{ n }}\n",
    "a{%- if t %} b {% endif -%} c\n  {%- for i in lst %}\n  - {{ i }}\n  {%- endfor %}\n",
    "{% if t +%}\nkeep newline{% endif %}|{% if t -%}\n   stripped{%- endif %}",
    "  {#- lead -#}  x  {#+ keep +#}\n  y\n",
    "\t{% set a = 1 %}\n\t{{ a }}\n \t {% if t %}\n in\n \t {% endif %}\nend",
    "{{- n -}}\n\n{{- n }}\n\n{{ n -}}\n\n{{ n }}",
    "{% macro m(x) %}\n  <{{ x }}>\n{% endmacro %}\n{{ m(1) }}{{ m(2) }}",
    "{%- for m in msgs -%}\n{{- m.role | upper }}: {{ m.content | trim }}\n{%- if not loop.last %}\n---\n{% endif -%}\n{%- endfor -%}",
    "{% set date_string = strftime_now('%d %b %Y') %}Today: {{ date_string }}\n{{- d | tojson(indent=4) }}",
    "{% for k, v in d | items %}{{ k }}={{ v | tojson }}{% if not loop.last %}, {% endif %}{% endfor %}",
    "{% for m in msgs %}{% if (m.role == 'user') != (loop.index0 % 2 == 1) %}{{ raise_exception('alternate!') }}{% endif %}{% endfor %}",
    # Loops.
    "{% for m in msgs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
    "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem.role }}/{{ loop.nextitem.role }};"
    "{% endfor %}",
    "{% for x in lst if x > 1 %}{{ x }}:{{ loop.length }},{% else %}empty{% endfor %}",
    "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
    "{% for a, b in nested %}{{ a }}{{ b }}{% endfor %}",
    "{% for x in missing %}no{% else %}undefined iterates empty{% endfor %}",
    "{% for x in lst %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{% for x in lst %}{% set y = x %}{% endfor %}[{{ y }}]",
    "{% for x in [1,2] %}{% if loop.first %}{% set y = 1 %}{% endif %}[{{ y }}]{% endfor %}",
    "{% for x in nil %}{% endfor %}",
    # Set, namespace, macros.
    "{% set a = 1 %}{% set b, c = [2, 3] %}{{ a }}{{ b }}{{ c }}",
    "{% set ns = namespace(count=0, found=false) %}{% for x in lst %}{% set ns.count = ns.count + x %}"
    "{% endfor %}{{ ns.count }} {{ ns.found }}",
    "{% set blk %}inner {{ n }}{% endset %}[{{ blk }}]",
    "{% set blk | upper %}inner {{ n }}{% endset %}[{{ blk }}]",
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}"
    "{{ greet('Bob') }} {{ greet('Al', greeting='Hi') }} {{ greet(name='Z') }}",
    "{% macro outer() %}[{{ caller() }}]{% endmacro %}{% call outer() %}body {{ n }}{% endcall %}",
    "{% macro rec(k) %}{% if k > 0 %}{{ k }}{{ rec(k - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
    "{% set x = 1 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ m() }}",
    "{% filter upper %}shout {{ n }}{% endfilter %}",
    "{% with a = 5 %}{{ a }}{% endwith %}[{{ a }}]",
    "{% set ns = namespace(d=d) %}{{ ns.d.b }}",
    "{% set x = lst.append(4) %}",
    "{% set x = d.pop('a') %}",
    "{% set d2 = dict(a=1, b='two') %}{{ d2 }} {{ dict(d2, c=3) }}",
    # Attribute / item access.
    "{{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ msgs[5] }} {{ d.c.y }} {{ d['a'][2] }} {{ d.a.1 }}",
    "{{ msgs[0].nope }}|{{ d.get('b') }}|{{ d.get('zz', 'dflt') }}|{{ d.get('zz') }}",
    "{{ missing.attr }}",
    "{{ missing['x'] }}",
    "{{ nil.attr }}|{{ n.attr }}",
    "{{ lst[1:] }} {{ lst[:-1] }} {{ lst[::-1] }} {{ lst[::2] }} {{ u[1:4] }} {{ u[::-1] }} {{ 'abc'[-1] }}",
    "{{ d.keys()|list }} {{ d.values() | list | length }} {{ d.items() | list | first }}",
    # String methods.
    "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') }}]",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'x</think>y'.split('</think>')[-1] }}",
    "{{ s.startswith('  He') }} {{ s.endswith('!  ') }} {{ 'abc'.startswith(('x', 'a')) }}",
    "{{ u.upper() }} {{ 'HeLLo wOrld'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
    "{{ 'aaa'.replace('a', 'b', 2) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }}",
    "{{ ', '.join(words) }} {{ '{} and {}'.format(1, 'x') }} {{ '{name}!'.format(name='n') }}",
    "{{ 'a\\nb\\r\\nc'.splitlines() }} {{ '123'.isdigit() }} {{ 'abc'.isalpha() }}",
    # Filters.
    "[{{ s|trim }}][{{ 'xxhixx'|trim('x') }}][{{ s|upper }}][{{ s|lower }}][{{ 'hello-world foo(bar)'|title }}][{{ 'hI'|capitalize }}]",
    "{{ lst|length }} {{ u|length }} {{ d|count }} {{ missing|length }} {{ lst|first }} {{ lst|last }} {{ 'abc'|last }}",
    "{{ lst|join(', ') }} {{ msgs|join('|', attribute='role') }} {{ missing|default('dflt') }} {{ ''|default('x', true) }} {{ nil|d('y') }}",
    "{{ 'abc'|list }} {{ msgs|map(attribute='role')|list }} {{ words|map('upper')|join(',') }} {{ msgs|map(attribute='nope', default='-')|list }}",
    "{{ lst|select('odd')|list }} {{ lst|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }}",
    "{{ msgs|selectattr('role', 'equalto', 'user')|list }} {{ msgs|rejectattr('role', 'in', ['user', 'system'])|map(attribute='content')|list }}",
    "{{ msgs|selectattr('extra')|list|length }} {{ msgs|selectattr('extra', 'defined')|list|length }}",
    "{{ d|items|list }} {{ d|dictsort }} {{ {'b': 1, 'A': 2, 'a': 3}|dictsort }} {{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }}",
    "{{ words|sort }} {{ words|sort(case_sensitive=true) }} {{ words|sort(reverse=true) }} {{ msgs|sort(attribute='role')|map(attribute='role')|list }}",
    "{{ words|unique|list }} {{ words|unique(case_sensitive=true)|list }} {{ lst|reverse|list }} {{ 'abc'|reverse }}",
    "{{ lst|min }} {{ lst|max }} {{ words|min }} {{ words|max }} {{ lst|sum }} {{ [1.5, 2]|sum }} {{ msgs|sum(attribute='extra', start=10) if false else 0 }}",
    "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 3|float }} {{ 'x'|float }}",
    "{{ -2.5|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 3|round }}",
    "{{ 'aXbX'|replace('X', '-') }} {{ 'line1\\nline2\\n\\nline3'|indent(2) }}|{{ 'a\\nb'|indent(4, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}",
    "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|safe }} {{ 'one two  three'|wordcount }} {{ lst|batch(2)|list }}",
    "{{ n|string ~ 'x' }} {{ lst|string }} {{ 'hi'|center(10) }}|{{ '%s-%d'|format('a', 3) }} {{ '%s=%r' % ('k', 'v') }}",
    "{{ d|tojson }}|{{ msgs|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ esc|tojson }}|{{ u|tojson }}",
    "{{ d|tojson(separators=(',', ':')) }}|{{ [big, small, f, -0.0]|tojson }}|{{ {}|tojson(indent=2) }}|{{ []|tojson(indent=2) }}",
    "{{ u|tojson(true) }}|{{ d|tojson(indent='\\t') }}",
    "{{ missing|tojson }}",
    "{{ 'x'|nosuchfilter }}",
    # Tests.
    "{{ n is defined }} {{ missing is defined }} {{ missing is undefined }} {{ nil is none }} {{ n is number }} {{ f is float }} {{ n is integer }} {{ t is integer }}",
    "{{ t is boolean }} {{ t is true }} {{ 1 is true }} {{ false is false }} {{ s is string }} {{ d is mapping }} {{ lst is mapping }}",
    "{{ lst is iterable }} {{ s is iterable }} {{ n is iterable }} {{ d is sequence }} {{ n is sequence }} {{ missing is iterable }}",
    "{{ n is odd }} {{ n is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 2 is in lst }} {{ 'a' is eq 'a' }} {{ 1 is ne 2 }}",
    "{{ 3 is gt 2 }} {{ 3 is lt 2 }} {{ 3 is ge 3 }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ nil is sameas none }} {{ n is not none }}",
    "{{ greet is callable }} {{ range is callable }} {{ 'upper' is filter }} {{ 'nope' is filter }}",
    # Globals.
    "{{ range(5)|list }} {{ range(2, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }}",
    "{{ raise_exception('boom: ' ~ n) }}",
    "{{ strftime_now('%Y-%m-%d %H:%M:%S') }} {{ strftime_now('%d %b %Y') }}",
    "{{ namespace(a=1).a }} {{ dict(x=1).x }}",
    # What harmony (GPT-OSS) templates use.
    "{% macro m() %}{% if model_identity is not defined %}{% set model_identity = 'id' %}{% endif %}"
    "{{ model_identity }}{% endmacro %}{{ m() }}|{{ model_identity }}|{{ m() }}",
    "{% for m in msgs[1:] %}{{ m.role }}({% for f in msgs[1:][loop.index:] %}{{ f.role }},{% endfor %});{% endfor %}",
    "{{ 'content' in msgs[0] }} {{ 'thinking' in msgs[0] }} {{ 'extra' not in msgs[2] }}",
    "{{ '\"' + words|join('\" | \"') + '\"' }} {{ 'a' + lst|length|string }}",
    "{% macro r(s, req, is_nullable=false) %}{{ is_nullable }}{{ req|length }}{{ s.a|length > 2 }}{% endmacro %}"
    "{{ r(d, lst) }} {{ r(d, [], true) }} {{ r(d, req=[1], is_nullable=nil) }}",
    "{{ lst is iterable and lst is not string and lst is not mapping and lst[0] is defined }} "
    "{{ s is iterable and s is not string }} {{ d is iterable and d is not mapping }}",
    "{% for m in msgs %}{% set m = m.role %}{{ m }}{% endfor %}|{% set found = false %}"
    "{% for x in lst %}{% set found = true %}{% endfor %}{{ found }}",
    "{{ (d.nope or []) }} {{ 'b' not in (d.nope or []) }} {{ 'x' if missing is defined else 'json' }}",
    "{{ 'x' + msgs[0].content|tojson + 'y' }} {{ '<' + esc|tojson + '>' }}",
    "{% set ns = namespace(name=none, found=false) %}{{ ns.name is none }}{% set ns.name = 'f' %}"
    "{% for x in lst %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.name }}{{ ns.found }}",
    "{{- 'x' }}\n<|start|>assistant\n{%- if t -%}\n<|start|>assistant\n{%- endif -%}\n",
    "{{ strftime_now('%Y-%m-%d') }} {{ 'Reasoning: ' + (nil or 'medium') }}",
    "{% for b in ['browser', 'python'] %}{{ '## ' ~ b ~ '\\n\\n' }}{% endfor %}",
    # Errors.
    "{% if %}",
    "{% for x in lst %}",
    "{{ 1 + }}",
    "{% endfor %}",
    "{% unknowntag %}",
    "line1\nline2\n{{ 'a' + 1 }}",
    "{{ 'a' + missing }}",
    "{{ nil + 1 }}",
    "{{ lst < 'a' }}",
    "{{ 1 / 0 }}",
    "{{ missing() }}",
    "{% set x.y = 1 %}",
    "{{ 'abc'.nomethod() }}",
    "{% break %}",
    "{% if false %}{{ x|nosuch }}{% endif %}deferred",
    "{% if false %}{{ x is nosuch }}{% endif %}deferred",
    "{% for x in [] %}{{ x|nosuch }}{% endfor %}",
    "{{ x is nosuch }}",
    "{% for x in s recursive %}{{ loop(x) }}{% endfor %}",
    "{% for x in nested recursive %}[{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}:{{ loop.depth }}{% endif %}]{% endfor %}",
    "{{ '%.2f|%5d|%-4s|%x|%e'|format(1.5, 42, 'ab', 255, 12345.678) }} {{ '%s' % 5 }} {{ '%03d' % 7 }}",
]


def main():
    env = hf_env.make_env()
    out = []
    for src in SNIPPETS:
        case = {"template": src, "context": CTX}
        case.update(hf_env.render(env, src, CTX))
        out.append(case)
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
