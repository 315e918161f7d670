"""Chat templates (models/chat.py), `HFTokenizer.apply_chat_template`, `decode(messages=...)` and `smcsd chat`.

The expected prompts below are written out by hand; they were checked once against transformers'
`apply_chat_template` (same strings), but these tests do not need transformers. The decode tests share one
tiny model config (1 layer), so all of them run one compiled program.
"""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from jinja2.exceptions import SecurityError

import smcsd
from smcsd.models import ByteTokenizer, HFTokenizer, ModelConfig, init_model
from smcsd.models.chat import ChatTemplateError, compile_chat_template, render_chat_template
from smcsd import cli

# SmolLM2-Instruct's template (ChatML with a default system message).
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOL_SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"

# Llama-3 style: BOS written by the template, trimmed contents, an unknown role refused by raise_exception.
LLAMA3 = ("{{ bos_token }}"
          "{% for message in messages %}"
          "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
          "{{ raise_exception('Unknown role ' + message['role'] + ': use system, user or assistant') }}"
          "{% endif %}"
          "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim"
          " + '<|eot_id|>' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# Multi-line, so trim_blocks / lstrip_blocks matter; tojson (with and without indent) and loop.first/last.
JSONLIST = ("{% for message in messages %}\n"
            "    {% if loop.first %}[{% endif %}\n"
            "{{ message | tojson }}{% if not loop.last %},{% else %}]{% endif %}\n"
            "{% endfor %}\n"
            "{% if tools %}\n"
            "TOOLS {{ tools | tojson(indent=2) }}\n"
            "{% endif %}\n"
            "{% if add_generation_prompt %}\n"
            "    >{{ eos_token }}\n"
            "{% endif %}")

HI = [{"role": "user", "content": "Hi"}]


# ----------------------------------------------------------------------------------- rendering

def test_chatml_smollm2():
    chat = HI + [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]
    assert render_chat_template(CHATML, chat) == (
        SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    system = [{"role": "system", "content": "Be brief."}] + HI
    assert render_chat_template(CHATML, system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


def test_llama3_bos_and_raise_exception():
    chat = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi\n"}]
    assert render_chat_template(LLAMA3, chat, bos_token="<|begin_of_text|>") == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    with pytest.raises(ValueError, match="Unknown role tool: use system, user or assistant") as e:
        render_chat_template(LLAMA3, [{"role": "tool", "content": "42"}])
    assert isinstance(e.value, ChatTemplateError)


def test_tojson_loop_last_and_whitespace_control():
    chat = [{"role": "user", "content": 'héllo <b> & "x"'}, {"role": "assistant", "content": "ok"}]
    # tojson keeps non-ASCII and does not HTML-escape; indent works; block lines leave no stray newlines
    assert render_chat_template(JSONLIST, chat, eos_token="</s>", tools=[{"name": "add"}]) == (
        '[{"role": "user", "content": "héllo <b> & \\"x\\""},{"role": "assistant", "content": "ok"}]'
        'TOOLS [\n  {\n    "name": "add"\n  }\n]\n    ></s>\n')
    assert render_chat_template(JSONLIST, HI, add_generation_prompt=False) == '[{"role": "user", "content": "Hi"}]'


def test_extras_generation_block_loopcontrols_strftime():
    tmpl = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
            "|{% generation %}G{% endgeneration %}|{{ strftime_now('%Y')|length }}|{{ tools is none }}"
            "|{{ enable_thinking }}")
    assert render_chat_template(tmpl, HI * 3, enable_thinking=False) == "Hi|G|4|True|False"


def test_text_parts_content():
    tmpl = ("{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
            "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %};{% endfor %}")
    chat = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}] + HI
    assert render_chat_template(tmpl, chat) == "ab;Hi;"
    with pytest.raises(TypeError, match="content as a plain string"):  # ChatML concatenates content as a str
        render_chat_template(CHATML, chat)


@pytest.mark.parametrize("tmpl", [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",  # a refused attribute raises even where plain Jinja would print ""
    "{{ messages.append(1) }}",  # the environment is immutable
    "{% set ns = namespace(_x=1) %}",
    "{{ raise_exception.__globals__ }}",
])
def test_sandbox_refuses_unsafe_access(tmpl):
    with pytest.raises(SecurityError) as e:
        render_chat_template(tmpl, HI)
    assert isinstance(e.value, ValueError) and "unsafe" in str(e.value)


def test_syntax_error_and_compile_cache():
    with pytest.raises(ValueError, match="syntax error at line 1"):
        render_chat_template("{% for m in messages %}", HI)
    assert compile_chat_template(CHATML) is compile_chat_template(CHATML)
    with pytest.raises(TypeError, match="Jinja string"):
        render_chat_template(None, HI)


@pytest.mark.parametrize("messages, error, words", [
    ("Hi", TypeError, "messages must be a list"),
    ({"role": "user", "content": "Hi"}, TypeError, "messages must be a list"),
    ([], ValueError, "messages is empty"),
    (["Hi"], TypeError, "message 0 is a str, not a dict"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], ValueError, 'message 1 needs a non-empty str "role"'),
    ([{"role": "user"}], ValueError, 'message 0 has no "content"'),
    ([{"role": "user", "content": 5}], TypeError, 'message 0 "content" must be a str'),
    ([{"role": "user", "content": ["a"]}], TypeError, "message 0 content part 0 must be a dict"),
    ([{"role": "user", "content": [{"type": "image", "url": "x"}]}], ValueError, "only text parts"),
    ([{"role": "user", "content": [{"type": "text"}]}], TypeError, 'needs a str "text"'),
])
def test_bad_messages(messages, error, words):
    with pytest.raises(error, match=words):
        render_chat_template(CHATML, messages)


# ----------------------------------------------------------------------------------- tokenizer

def _chat_tokenizer(template: str | None = CHATML) -> HFTokenizer:
    """A byte-level BPE (bytes 0..255, <s>=256, </s>=257, <pad>=258) plus <|im_start|>=259, <|im_end|>=260."""
    from tokenizers import Tokenizer

    from smcsd.models.hf import byte_tokenizer_json
    raw = Tokenizer.from_str(byte_tokenizer_json())
    raw.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    return HFTokenizer.from_object(raw, bos_id=256, eos_id=257, pad_id=258, chat_template=template, name="chatml")


@pytest.fixture(scope="module")
def tok():
    return _chat_tokenizer()


def test_tokenizer_apply_chat_template(tok):
    text = tok.apply_chat_template(HI)
    assert text == SMOL_SYSTEM + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.apply_chat_template(HI, tokenize=True)
    assert ids == tok.encode(text, add_bos=False) and ids[0] == 259 and ids.count(260) == 2 and 256 not in ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    # the template sees bos_token / eos_token as the tokenizer's strings; chat_template= overrides
    assert tok.apply_chat_template(HI, chat_template="{{ bos_token }}|{{ eos_token }}") == "<s>|</s>"
    assert tok.end_of_turn_ids == [260, 257]  # <|im_end|> (written by the template), then EOS


def test_tokenizer_without_template(tok):
    bare = _chat_tokenizer(None)
    with pytest.raises(ValueError, match="has no chat template.*chat_template="):
        bare.apply_chat_template(HI)
    assert bare.apply_chat_template(HI, chat_template="{{ messages[0].content }}") == "Hi"
    assert bare.end_of_turn_ids == [257]


# ----------------------------------------------------------------------------------- decode

CONFIG = ModelConfig(vocab_size=261, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, max_position_embeddings=256)
DECODE = dict(method="ar", max_new_tokens=8, seed=3, temperature=1.0)


@pytest.fixture(scope="module")
def model(tok):
    return init_model(CONFIG, 0, tokenizer=tok, name="tiny-chat")


@pytest.fixture(scope="module")
def says_im_end(model):
    """The same config with weights that make <|im_end|> overwhelmingly likely after any token."""
    import jax
    params = jax.tree_util.tree_map(np.array, model.params)  # a writable numpy copy
    params["layers"]["self_attn"]["o_proj"]["kernel"][:] = 0  # the layer adds nothing: hidden = embedding
    params["layers"]["mlp"]["down_proj"]["kernel"][:] = 0
    u = np.linspace(-1.0, 1.0, CONFIG.hidden_size).astype(np.float32)
    params["embed_tokens"]["embedding"][:] = u  # every token embeds to u
    params["lm_head"][:] = 0
    params["lm_head"][260] = 10 * u / np.sqrt(np.mean(u ** 2))  # logit of <|im_end|> = 10 * hidden_size, others 0
    return dataclasses.replace(model, params=params)


def test_decode_messages_is_the_rendered_prompt(model, tok):
    res = smcsd.decode(messages=HI, target=model, **DECODE)
    ids = tok.apply_chat_template(HI, tokenize=True)
    ref = smcsd.decode(ids, target=model, eos_id=tok.end_of_turn_ids, **DECODE)
    assert res.tokens == ref.tokens and res.texts == ref.texts and len(res.tokens[0]) >= 1


def test_decode_messages_stops_at_end_of_turn(says_im_end):
    res = smcsd.decode(messages=HI, target=says_im_end, **DECODE)
    assert res.tokens == [[260]] and res.texts == [""]  # <|im_end|> stops (and is dropped from the text)
    # an explicit eos_id wins over the end-of-turn default (two stop ids: the same compiled program)
    res = smcsd.decode(messages=HI, target=says_im_end, eos_id=[257, 258], **DECODE)
    assert res.tokens == [[260] * 8]


def test_decode_messages_errors(model, tok):
    with pytest.raises(ValueError, match="either prompt or messages, not both"):
        smcsd.decode("Hi", messages=HI, target=model)
    with pytest.raises(ValueError, match="needs a prompt .* or messages"):
        smcsd.decode(target=model)
    with pytest.raises(ValueError, match="has no chat template"):
        smcsd.decode(messages=HI, target=dataclasses.replace(model, tokenizer=_chat_tokenizer(None)))
    with pytest.raises(ValueError, match="has no chat template"):
        smcsd.decode(messages=HI, target=dataclasses.replace(model, tokenizer=ByteTokenizer()))  # it has none
    with pytest.raises(ValueError, match="no tokenizer"):
        smcsd.decode(messages=HI, target=dataclasses.replace(model, tokenizer=None))
    with pytest.raises(TypeError, match="conversation 1: message 0 is a str"):
        smcsd.decode(messages=[HI, ["Hi"]], target=model)
    with pytest.raises(ValueError, match="messages is empty"):
        smcsd.decode(messages=[], target=model)


# ----------------------------------------------------------------------------------- smcsd chat / fetch

def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def chat_dir(model, tok, tmp_path_factory):
    """`model` saved as a Hugging Face checkpoint whose tokenizer_config.json has the ChatML template."""
    from smcsd.models import save_pretrained
    d = tmp_path_factory.mktemp("chat-model")
    save_pretrained(dataclasses.replace(model, tokenizer=None), str(d))
    tok._tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False,
        "chat_template": CHATML}))
    return d


def test_chat_one_message(capsys, chat_dir):
    code, out, err = run(capsys, "chat", "--target", str(chat_dir), "--max-new-tokens", "8", "--seed", "3",
                         "--temperature", "1", "--stats", "Hi")
    assert code == 0, err
    lines = out.rstrip("\n").split("\n")
    assert lines[-1].startswith("ar | ") and len(lines) >= 2  # the answer, then the stats line


class _FakeDecode:
    """Stands in for smcsd.decode in the loop test: records each conversation and answers "answer N"."""

    def __init__(self):
        self.calls = []

    def __call__(self, *, messages, **kwargs):
        self.calls.append([dict(m) for m in messages])
        return SimpleNamespace(texts=[f" answer {len(self.calls)}\n"], stats=None)


def test_chat_interactive_keeps_history(capsys, monkeypatch, chat_dir):
    fake = _FakeDecode()
    monkeypatch.setattr(smcsd, "decode", fake)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n\nHow are you?\n/exit\nnever read\n"))
    code, out, err = run(capsys, "chat", "--target", str(chat_dir), "--system", "Be brief.")
    assert code == 0, err
    assert out == "answer 1\nanswer 2\n"
    assert fake.calls[1] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "answer 1"},
                             {"role": "user", "content": "How are you?"}]
    monkeypatch.setattr(sys, "stdin", io.StringIO("one message\nfrom stdin\n"))  # '-': all of stdin, one turn
    assert run(capsys, "chat", "--target", str(chat_dir), "-")[1] == "answer 3\n"
    assert fake.calls[-1] == [{"role": "user", "content": "one message\nfrom stdin\n"}]


def test_chat_default_model_missing(capsys, monkeypatch):
    monkeypatch.setattr(smcsd, "available_models", lambda: [])
    code, out, err = run(capsys, "chat", "Hi")
    assert code == 2 and err.count("\n") == 1 and "smcsd fetch smollm2-135m" in err


@pytest.mark.parametrize("argv, words", [
    (["chat", "--temperature", "-1", "Hi"], "--temperature"),
    (["chat", "--top-p", "2", "Hi"], "--top-p"),
    (["chat", "--method", "beam", "Hi"], "--method"),
    (["chat", "--target", "/no/such/dir", "Hi"], "--target"),
    (["chat", "--model", "random", "--target", "/tmp", "Hi"], "--model"),
    (["chat", "a", "b"], "unrecognized arguments"),
    (["fetch"], "NAME"),
])
def test_chat_bad_arguments_one_line(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code != 0 and err.count("\n") == 1 and err.startswith("smcsd: error:") and words in err, err


def test_chat_model_without_template(capsys, model, tmp_path):
    from smcsd.models import save_pretrained
    save_pretrained(dataclasses.replace(model, tokenizer=None), str(tmp_path))  # no tokenizer, no template
    code, out, err = run(capsys, "chat", "--target", str(tmp_path), "Hi")
    assert code == 2 and err.count("\n") == 1 and "has no chat template" in err and "--target DIR" in err


def test_fetch_prints_path(capsys, monkeypatch, tmp_path):
    registry = pytest.importorskip("smcsd.models.registry", reason="models.registry (smcsd fetch's backend) isn't there yet")
    monkeypatch.setattr(registry, "fetch", lambda name: tmp_path / name)
    code, out, err = run(capsys, "fetch", "smollm2-135m")
    assert code == 0 and out == f"{tmp_path / 'smollm2-135m'}\n", err


def test_fetch_without_registry_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "smcsd.models.registry", None)  # as if the module were not installed
    code, out, err = run(capsys, "fetch", "smollm2-135m")
    assert code == 2 and err.count("\n") == 1 and "smcsd.models.registry" in err
