"""A small subset of TeX -> MathML, so that the pages carry their equations as MathML Core
(rendered by the browser itself: no MathJax, no CDN, nothing fetched at view time).

Supported: ``\\frac{a}{b}``, ``\\sqrt{a}``, ``x_i``, ``x^2``, ``x_i^2``, ``{...}`` groups,
``\\left( ... \\right)``, ``\\text{...}``, ``\\mathrm{...}``, ``\\operatorname{...}``, the Greek
letters and operators in the tables below, ``\\,`` ``\\;`` ``\\quad`` spaces. Anything else raises
``ValueError`` at build time, so a typo in an equation cannot reach a page.
"""

from __future__ import annotations

import html
import re

GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ϵ", "varepsilon": "ε",
    "eta": "η", "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π", "sigma": "σ", "tau": "τ",
    "phi": "ϕ", "Phi": "Φ", "Delta": "Δ", "Sigma": "Σ", "nabla": "∇", "partial": "∂",
}  # fmt: skip
OPERATORS = {
    "cdot": "·", "times": "×", "odot": "⊙", "in": "∈", "le": "≤", "ge": "≥", "ne": "≠",
    "approx": "≈", "sim": "∼", "to": "→", "mapsto": "↦", "leftarrow": "←", "gets": "←", "infty": "∞",
    "ldots": "…", "dots": "…", "mid": "∣", "land": "∧", "wedge": "∧", "top": "⊤", "sum": "∑",
    "prod": "∏", "{": "{", "}": "}", "|": "‖", "lVert": "‖", "rVert": "‖", "lfloor": "⌊", "rfloor": "⌋",
}  # fmt: skip
FUNCTIONS = {"exp", "log", "max", "min", "sin", "cos", "tanh", "erf", "softmax", "argmax", "mean"}
UNDER = {"sum", "prod", "max", "min", "argmax"}  # display-style limits go under/over these
DOUBLE_STRUCK = {"R": "ℝ", "N": "ℕ", "Z": "ℤ"}
SPACES = {",": "0.17em", ";": "0.28em", "quad": "1em", "qquad": "2em", " ": "0.25em"}

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[0-9]+(?:\.[0-9]+)?|\s+|.")


def tex_to_mathml(tex: str, display: bool = True) -> str:
    """``tex`` -> one ``<math>`` element (the TeX kept as ``alttext``)."""
    parser = _Parser(tex)
    body = parser.sequence(stop=None)
    attrs = ' display="block"' if display else ""
    return f'<math{attrs} alttext="{html.escape(tex)}"><mrow>{body}</mrow></math>'


class _Parser:
    def __init__(self, tex: str):
        self.tex = tex
        self.tokens = _TOKEN.findall(tex)  # whitespace kept for \\text{...}, skipped elsewhere
        self.pos = 0

    def error(self, message: str) -> ValueError:
        return ValueError(f"{message} in equation {self.tex!r}")

    def peek(self, raw: bool = False) -> str | None:
        while not raw and self.pos < len(self.tokens) and self.tokens[self.pos].isspace():
            self.pos += 1
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, raw: bool = False) -> str:
        if self.peek(raw) is None:
            raise self.error("unexpected end")
        self.pos += 1
        return self.tokens[self.pos - 1]

    def sequence(self, stop: str | None) -> str:
        """Atoms with their scripts until ``stop`` (consumed) or the end."""
        out: list[str] = []
        while True:
            token = self.peek()
            if token is None:
                if stop is not None:
                    raise self.error(f"missing {stop}")
                return "".join(out)
            if token == stop:
                self.take()
                return "".join(out)
            if token in ("}", "\\right") and stop != token:
                raise self.error(f"unbalanced {token}")
            base_token = token
            base = self.atom()
            if self.peek() in ("_", "^"):
                base = self.scripts(base, under=base_token.lstrip("\\") in UNDER)
            out.append(base)

    def scripts(self, base: str, under: bool) -> str:
        sub = sup = None
        while self.peek() in ("_", "^"):
            which = self.take()
            value = self.atom()
            if which == "_":
                sub = value
            else:
                sup = value
        if under:
            if sub is not None and sup is not None:
                return f"<munderover>{base}{sub}{sup}</munderover>"
            return f"<munder>{base}{sub}</munder>" if sub is not None else f"<mover>{base}{sup}</mover>"
        if sub is not None and sup is not None:
            return f"<msubsup>{base}{sub}{sup}</msubsup>"
        return f"<msub>{base}{sub}</msub>" if sub is not None else f"<msup>{base}{sup}</msup>"

    def braced_text(self) -> str:
        """The raw characters of a ``{...}`` argument (for \\text and friends)."""
        if self.take() != "{":
            raise self.error("expected {")
        depth, parts = 1, []
        while True:
            token = self.take(raw=True)
            depth += token == "{"
            depth -= token == "}"
            if depth == 0:
                return "".join(parts).replace("\\_", "_")
            parts.append(token)

    def atom(self) -> str:
        token = self.take()
        if token == "{":
            return f"<mrow>{self.sequence('}')}</mrow>"
        if token[0].isdigit():
            return f"<mn>{token}</mn>"
        if token.isalpha() and len(token) == 1:
            return f"<mi>{token}</mi>"
        if token.startswith("\\") and len(token) > 1:
            return self.command(token[1:])
        if token == "-":
            return "<mo>−</mo>"
        if token == "'":
            return "<mo>′</mo>"
        if token in "()[]|":  # only \\left ... \\right fences grow with their content
            return f'<mo stretchy="false">{token}</mo>'
        if token in "+=,<>/!:.*":
            return f"<mo>{html.escape(token)}</mo>"
        raise self.error(f"unsupported character {token!r}")

    def command(self, name: str) -> str:
        if name == "frac":
            return f"<mfrac>{self.atom()}{self.atom()}</mfrac>"
        if name == "sqrt":
            return f"<msqrt>{self.atom()}</msqrt>"
        if name == "text":
            text = self.braced_text().replace(" ", "\u00a0")  # keep the spaces around words
            return f"<mtext>{html.escape(text)}</mtext>"
        if name in ("mathrm", "operatorname"):
            text = html.escape(self.braced_text())
            return f'<mi mathvariant="normal">{text}</mi>' if len(text) == 1 else f"<mi>{text}</mi>"
        if name == "mathbb":
            letters = self.braced_text()
            return f"<mi>{''.join(DOUBLE_STRUCK.get(c, c) for c in letters)}</mi>"
        if name == "left":
            opening = self.take()
            inner = self.sequence("\\right")
            closing = self.take()
            fence = lambda t: "" if t == "." else f'<mo stretchy="true">{html.escape(t)}</mo>'
            return f"<mrow>{fence(opening)}{inner}{fence(closing)}</mrow>"
        if name in GREEK:
            variant = ' mathvariant="normal"' if GREEK[name].isupper() else ""
            return f"<mi{variant}>{GREEK[name]}</mi>"
        if name in OPERATORS:
            return f"<mo>{html.escape(OPERATORS[name])}</mo>"
        if name in FUNCTIONS:
            return f"<mi>{name}</mi>"
        if name in SPACES:
            return f'<mspace width="{SPACES[name]}"/>'
        raise self.error(f"unsupported command \\{name}")
