"""Chat templates of the ChatML family (SmolLM2's), rendered in plain Python.

A chat model is trained on conversations written out as text in one fixed shape; its
files ship that shape as a Jinja template (``tokenizer.chat_template`` in a GGUF,
``chat_template`` in tokenizer_config.json). SmolLM2's is ChatML: each message is

    <|im_start|>{role}\\n{content}<|im_end|>\\n

a conversation that does not open with a system message gets a default one first
("You are a helpful AI assistant named SmolLM, trained by Hugging Face"), and
``add_generation_prompt`` appends ``<|im_start|>assistant\\n`` so that the model's next
tokens are the assistant's reply (it ends it with ``<|im_end|>``, the file's eos).

Jinja is a programming language; this module does not interpret it. It recognises the
ChatML templates written exactly in this family's shape (with or without a default
system prompt) and renders them; any other template is a ``ValueError`` rather than a
prompt rendered wrongly (render those with jinja2, as transformers does).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

# SmolLM2's template as a regex: its default system prompt (group "system") is optional and
# read from it; spaces just inside the Jinja delimiters and whitespace-control dashes may vary.
# Nothing may stand between the tags: Jinja would output it.
_OUT, _END_OUT = r"\{\{-? ?", r" ?-?\}\}"  # {{ expression }}
_TAG, _END_TAG = r"\{%-? ?", r" ?-?%\}"  # {% statement %}
_NEWLINE = r"(?:\n|\\n)"  # a newline inside a Jinja string: written as is, or escaped
_DEFAULT_SYSTEM = (
    rf"{_TAG}if loop\.first and messages\[0\]\['role'\] != 'system'{_END_TAG}"
    rf"{_OUT}'<\|im_start\|>system{_NEWLINE}(?P<system>[^'\\]*)<\|im_end\|>{_NEWLINE}'{_END_OUT}"
    rf"{_TAG}endif{_END_TAG}"
)
_CHATML = re.compile(
    rf"{_TAG}for message in messages{_END_TAG}"
    rf"(?:{_DEFAULT_SYSTEM})?"
    rf"{_OUT}'<\|im_start\|>' \+ message\['role'\] \+ '{_NEWLINE}' \+ message\['content'\] \+ "
    rf"'<\|im_end\|>' \+ '{_NEWLINE}'{_END_OUT}"
    rf"{_TAG}endfor{_END_TAG}"
    rf"{_TAG}if add_generation_prompt{_END_TAG}{_OUT}'<\|im_start\|>assistant{_NEWLINE}'{_END_OUT}{_TAG}endif{_END_TAG}"
    r"\n?"  # Jinja drops one trailing newline of a template
)


def parse_chatml_template(template: str) -> str | None:
    """A ChatML template of SmolLM2's shape -> its default system prompt (None if it has none).

    Raises ValueError for any other template."""
    if not isinstance(template, str):
        raise TypeError(f"the chat template must be a str, got {type(template).__name__}")
    match = _CHATML.fullmatch(template)
    if match is None:
        raise ValueError(
            "the chat template is not a ChatML template of SmolLM2's shape, which is all this renderer "
            "implements; render it with jinja2 (transformers' apply_chat_template) instead"
        )
    return match.group("system")


def apply_chat_template(
    messages: Sequence[Mapping[str, str]], template: str, add_generation_prompt: bool = True
) -> str:
    """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) as ``template`` would.

    ``template`` is the file's own template string (``GGUFInfo.chat_template``): it is checked
    to be one this function implements (``parse_chatml_template``), and its default system
    prompt is read from it."""
    default_system = parse_chatml_template(template)
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}"
        )
    if not isinstance(add_generation_prompt, bool):
        raise TypeError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not {"role", "content"} <= message.keys():
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
        for key in ("role", "content"):
            if not isinstance(message[key], str):
                raise TypeError(f"messages[{i}][{key!r}] must be a str, got {type(message[key]).__name__}")
    parts = []
    if default_system is not None and messages and messages[0]["role"] != "system":
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for message in messages:
        parts.append(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)
