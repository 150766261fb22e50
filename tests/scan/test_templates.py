"""Chat templates judged by Jinja2's own parser (issue 62 item 4): the templates models
ship are safe, every escape class is dangerous however it spells its names.

The benign templates are the published chat templates of widely used model families
(ChatML as Qwen and others ship it, Llama 2, Llama 3, Mistral, Gemma, Zephyr, a tool-use
template with namespace()), written here in full as their tokenizer_config.json carry them."""

from __future__ import annotations

import pytest

from hpcml.scan.model import Verdict
from hpcml.scan.templates import judge

BENIGN = {
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
              "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
              "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
              "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
              "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
              "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    "llama3": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
              "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
              "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    "mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
               "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
               "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
               "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    "gemma": "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}{% for message in messages %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}"
             "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
             "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
             "{{'<start_of_turn>model\\n'}}{% endif %}",
    "zephyr": "{% for message in messages %}\\n{% if message['role'] == 'user' %}\\n{{ '<|user|>\\n' + message['content'] "
              "+ eos_token }}\\n{% elif message['role'] == 'system' %}\\n{{ '<|system|>\\n' + message['content'] + "
              "eos_token }}\\n{% elif message['role'] == 'assistant' %}\\n{{ '<|assistant|>\\n'  + message['content'] + "
              "eos_token }}\\n{% endif %}\\n{% if loop.last and add_generation_prompt %}\\n{{ '<|assistant|>' }}\\n"
              "{% endif %}\\n{% endfor %}",
    "tools": "{% set ns = namespace(system=false, tools=[]) %}{% for message in messages %}{% if message.role == 'system' %}"
             "{% set ns.system = true %}{% endif %}{% endfor %}{% if tools %}{% for tool in tools %}"
             "{{ tool.function.name ~ ': ' ~ tool.function.description | default('') }}{% endfor %}{% endif %}"
             "{% for message in messages %}{% if message.tool_calls %}{% for call in message.tool_calls %}"
             "{{ call.function.name }}({{ call.function.arguments | tojson }}){% endfor %}{% endif %}"
             "{% if messages[loop.index0 - 1].role == 'tool' %}{{ message.content | join(', ') }}{% endif %}"
             "{% endfor %}{{ messages | map(attribute='role') | unique | list | length }}",
}

ESCAPES = {
    "lipsum globals": "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "computed subscript (the issue's)": "{{ lipsum[('_' * 2) ~ 'globals' ~ ('_' * 2)]['os'].popen('id').read() }}",
    "replace filter builds the name": "{{ lipsum[('xxglobalsxx'|replace('x', '_'))] }}",
    "attr filter": "{{ lipsum|attr('\\x5f\\x5fglobals\\x5f\\x5f') }}",
    "attr filter, computed": "{% set n = '%c%cglobals%c%c'|format(95, 95, 95, 95) %}{{ lipsum|attr(n) }}",
    "class walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler internals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "joiner internals": "{{ joiner.__init__.__globals__['os'].system('id') }}",
    "namespace internals": "{{ namespace.__init__.__globals__ }}",
    "self context": "{{ self._TemplateReference__context.cycler }}",
    "str.format reads attributes": "{{ '{0.__class__}'.format(messages) }}",
    "frame of a filter's generator": "{{ (messages|map('string')).gi_frame.f_builtins['eval']('1') }}",
    "map by a private attribute": "{{ messages|map(attribute='__class__')|list }}",
    "include": "{% include 'other.j2' %}",
    "import": "{% import 'macros.j2' as m %}",
    "lipsum as a value": "{% set f = lipsum %}{{ f }}",
}


@pytest.mark.parametrize("name", sorted(BENIGN))
def test_the_templates_models_ship_are_safe(name):
    assert judge(BENIGN[name]) is None


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_every_escape_class_is_dangerous_however_spelt(name):
    problem = judge(ESCAPES[name])
    assert problem is not None and problem[0] is Verdict.DANGEROUS, (name, problem)


def test_a_template_jinja2_cannot_parse_is_an_error_not_safe():
    problem = judge("{% for m in messages %}{{ m }")
    assert problem is not None and problem[0] is Verdict.ERROR and "line 1" in problem[1]
