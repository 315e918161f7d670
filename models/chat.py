"""Hugging Face chat templates: render a conversation into the prompt text an instruct model was trained on.

A chat template is a Jinja string shipped with the tokenizer (`tokenizer_config.json`'s `chat_template`,
or `chat_template.jinja`). It is rendered here with the semantics of transformers' `apply_chat_template`,
so a model sees exactly the prompt it would get there: a sandboxed, immutable Jinja environment with
`trim_blocks` and `lstrip_blocks`, the loop-controls extension (`break`/`continue`), the `{% generation %}`
block (rendered as its body), the globals `raise_exception(msg)` and `strftime_now(fmt)`, a `tojson` filter
that keeps non-ASCII characters and takes `indent`, and the variables `messages`, `add_generation_prompt`,
`bos_token`, `eos_token`, `tools`, `documents` plus any extra keyword arguments.

Templates come from downloaded files, so they are untrusted code: the sandbox refuses attribute access
to Python internals (`''.__class__`, ...) with a `SecurityError`, and nothing they compute can mutate the
caller's messages.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "ChatTemplateSecurityError", "compile_chat_template", "render_chat_template",
           "validate_messages"]

_MESSAGE_HINT = 'each message must be a dict like {"role": "user", "content": "Hello"}'


class ChatTemplateError(ValueError):
    """A chat template that does not compile, or that refuses or fails to render a conversation."""


class ChatTemplateSecurityError(ChatTemplateError, SecurityError):
    """A chat template that tried something the sandbox forbids (e.g. reaching Python internals)."""


# ----------------------------------------------------------------------------------- environment

def _raise_exception(message):
    """The templates' `raise_exception(msg)`: how a template says it cannot format these messages."""
    raise ChatTemplateError(f"the chat template refused these messages: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' `tojson`: plain `json.dumps` (non-ASCII kept, no HTML escaping), optional indent."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    """The templates' `strftime_now(fmt)`: today's date or time, e.g. for a system prompt's "Today is ..."."""
    return datetime.now().strftime(fmt)


def _make_dict(*args, **kwargs):
    """The templates' `dict(...)`: a plain function, so `dict.mro()`-style type games lead nowhere."""
    return dict(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace()` that refuses underscore-prefixed names, so templates cannot shadow internals."""

    def __init__(*args, **kwargs):  # noqa: N805  (Namespace's own signature trick: `self` may be a kwarg)
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the underscore-prefixed attribute {name!r} "
                                "on a namespace")


class _Undefined(jinja2.Undefined):
    """Jinja's lenient `Undefined` (missing keys are falsy and render empty, as templates expect), except that
    a value the sandbox refused (`''.__class__`) raises its SecurityError on any use instead of printing ""."""

    def _refused(self) -> bool:
        return self._undefined_exception is SecurityError

    def __str__(self):
        if self._refused():
            self._fail_with_undefined_error()
        return super().__str__()

    def __bool__(self):
        if self._refused():
            self._fail_with_undefined_error()
        return super().__bool__()

    def __iter__(self):
        if self._refused():
            self._fail_with_undefined_error()
        return super().__iter__()


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks assistant text for training masks): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller):
        return caller()


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    """The one sandboxed environment every template compiles in (built once)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=_Undefined,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_make_dict,
                       namespace=_Namespace)
    return env


@functools.lru_cache(maxsize=64)
def compile_chat_template(template: str) -> jinja2.Template:
    """The compiled template (cached on the template string: a chat compiles its template once)."""
    if not isinstance(template, str):
        raise TypeError(f"chat template must be a Jinja string, got {type(template).__name__}")
    try:
        return _environment().from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template has a Jinja syntax error at line {e.lineno}: {e.message}; "
                                "check the template string (tokenizer_config.json's chat_template)") from None


# ----------------------------------------------------------------------------------- messages

def _check_parts(i: int, parts) -> list[dict]:
    """Message i's content given as a list of parts: each {"type": "text", "text": str}."""
    out = []
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise TypeError(f"message {i} content part {j} must be a dict like "
                            f'{{"type": "text", "text": "..."}}, got {type(part).__name__}')
        kind = part.get("type")
        if kind != "text":
            raise ValueError(f"message {i} content part {j} has type {kind!r}: only text parts "
                             '{"type": "text", "text": "..."} are supported (these are text-only models)')
        if not isinstance(part.get("text"), str):
            raise TypeError(f'message {i} content part {j} needs a str "text", got {part.get("text")!r}')
        out.append(dict(part))
    return out


def _check_message(i: int, message) -> dict:
    """A copy of message i after checking its role and content."""
    if not isinstance(message, Mapping):
        raise TypeError(f"message {i} is a {type(message).__name__}, not a dict: {_MESSAGE_HINT}")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f'message {i} needs a non-empty str "role" (e.g. "system", "user", "assistant"), '
                         f"got {role!r}")
    if "content" not in message:
        raise ValueError(f'message {i} has no "content": {_MESSAGE_HINT}')
    content = message["content"]
    out = dict(message)
    if isinstance(content, str):
        return out
    if content is None and message.get("tool_calls"):  # an assistant turn that only calls tools
        return out
    if isinstance(content, (list, tuple)):
        out["content"] = _check_parts(i, content)
        return out
    raise TypeError(f'message {i} "content" must be a str or a list of {{"type": "text", "text": ...}} parts, '
                    f"got {type(content).__name__}")


def validate_messages(messages) -> list[dict]:
    """Checked copies of a conversation's messages: a non-empty list of dicts with a str "role" and a
    "content" (a str, or a list of text parts). Errors name the message index and the expected form."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, (list, tuple)):
        raise TypeError(f"messages must be a list of message dicts ({_MESSAGE_HINT}), "
                        f"got {type(messages).__name__}")
    if not messages:
        raise ValueError(f"messages is empty: give at least one message ({_MESSAGE_HINT})")
    return [_check_message(i, m) for i, m in enumerate(messages)]


# ----------------------------------------------------------------------------------- rendering

def render_chat_template(template: str, messages, *, add_generation_prompt: bool = True, bos_token: str = "",
                         eos_token: str = "", **kwargs) -> str:
    """The prompt text for `messages` under the Jinja chat `template` (transformers' semantics).

    add_generation_prompt: end with the header of an assistant turn (what a model answers after).
    bos_token / eos_token: the tokenizer's special-token strings, which many templates write themselves.
    kwargs: more template variables, e.g. `tools=[...]`, `documents=[...]`, `enable_thinking=False`
    (`tools` and `documents` default to None, as in transformers).
    """
    compiled = compile_chat_template(template)
    checked = validate_messages(messages)
    variables = {"tools": None, "documents": None, **kwargs}
    try:
        return compiled.render(messages=checked, add_generation_prompt=bool(add_generation_prompt),
                               bos_token=bos_token, eos_token=eos_token, **variables)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateSecurityError(f"the chat template tried an unsafe operation, refused by the sandbox: "
                                        f"{e.message}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template failed to render these messages: {e.message}") from None
    except TypeError as e:
        hint = ("; it may expect each message's content as a plain string, not a list of parts"
                if any(isinstance(m.get("content"), list) for m in checked) else "")
        raise TypeError(f"the chat template failed to render these messages: {e}{hint}") from None
