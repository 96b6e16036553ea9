"""Which vowpalwabbit options may reach VW: an allow-list, for the extra arguments a user passes
(``controller.rail.vw_extra_args``) and for the options a saved VW model carries in its header.

VW's command line can name files (``-d``, ``-f``, ``--cache_file``, ``--readable_model``, ``-p``,
``--invert_hash``, ...), open network ports (``--daemon``, ``--port``) or reach other hosts
(``--sendto``). A run directory is data that users share: its ``config.yaml`` and the VW model
inside its checkpoints must not be able to make VW write a file. So only options that shape
learning -- rates, regularisation, interactions, exploration -- are accepted, each with a value
of the kind it takes (a number, namespace letters, one of a few names); anything else is
refused with the option named.

A saved model is checked the same way before VW reads it: VW re-applies the options stored in
a model's header when it loads one, and that header is plain bytes a crafted checkpoint can
set (its checksum is a public hash). ``model_options`` reads them out of the header.

>>> check_extra_args("--l2 1e-6 -q ss --interactions=sas")
['--l2', '1e-6', '-q', 'ss', '--interactions', 'sas']
>>> check_extra_args("--l2 1e-6 --readable_model /tmp/x.txt")
Traceback (most recent call last):
...
controller.rail.vw_args.VWArgsError: controller.rail.vw_extra_args: '--readable_model' is not an option railgate passes to vowpalwabbit (none that names a file, a port or a host; only learning options such as --l2, --power_t, -q: controller/rail/vw_args.py); remove it
"""

from __future__ import annotations

import re
import shlex
import struct

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_NAMESPACES = re.compile(r"[A-Za-z0-9_:]{1,16}")
_NAME = re.compile(r"[a-z_]{1,24}")

NUMBER, NAMESPACES, NAME, FLAG = "a number", "namespace letters", "a name", None
"""What an option takes: a value of one of these kinds, or (FLAG) none."""

OPTIONS: dict[str, str | None] = {
    # learning rate and its schedule
    "--learning_rate": NUMBER,
    "--power_t": NUMBER,
    "--initial_t": NUMBER,
    "--decay_learning_rate": NUMBER,
    "--adaptive": FLAG,
    "--normalized": FLAG,
    "--invariant": FLAG,
    "--sgd": FLAG,
    # regularisation
    "--l1": NUMBER,
    "--l2": NUMBER,
    "--no_bias_regularization": FLAG,
    # features and interactions
    "--bit_precision": NUMBER,
    "--quadratic": NAMESPACES,
    "--cubic": NAMESPACES,
    "--interactions": NAMESPACES,
    "--ignore": NAMESPACES,
    "--ignore_linear": NAMESPACES,
    "--keep": NAMESPACES,
    "--noconstant": FLAG,
    "--constant": NUMBER,
    "--hash_seed": NUMBER,
    "--loss_function": NAME,
    # exploration (SquareCB and the contextual-bandit reduction under it)
    "--gamma_scale": NUMBER,
    "--gamma_exponent": NUMBER,
    "--elim": FLAG,
    "--mellowness": NUMBER,
    "--cb_min_cost": NUMBER,
    "--cb_max_cost": NUMBER,
    "--cb_type": NAME,
    "--epsilon": NUMBER,
    "--random_seed": NUMBER,
}
SHORT = {"-l": "--learning_rate", "-b": "--bit_precision", "-q": "--quadratic", "-C": "--constant"}

MODEL_OPTIONS: dict[str, str | None] = {
    **OPTIONS,
    # the reduction chain railgate builds (--cb_explore_adf --squarecb); VW writes these into every model
    "--cb_explore_adf": FLAG,
    "--cb_adf": FLAG,
    "--squarecb": FLAG,
    "--csoaa_ldf": NAME,
    "--csoaa_rank": FLAG,
}
"""What a saved model's header may carry: the user's options plus railgate's own reduction chain."""

VALUE_NAMES = {
    "--loss_function": {"squared", "logistic", "hinge", "quantile", "poisson", "classic", "expectile"},
    "--cb_type": {"ips", "dm", "dr", "mtr", "sm"},
    "--csoaa_ldf": {"multiline", "m", "singleline", "s"},
}


class VWArgsError(ValueError):
    """VW options that railgate does not pass on; the message names the option and the fix."""


def check_extra_args(text: str, key: str = "controller.rail.vw_extra_args") -> list[str]:
    """The tokens of ``text`` (``--name=value`` split in two) when every option is allowed."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise VWArgsError(f"{key}={text[:80]!r} cannot be split into arguments ({exc}); check the quotes") from None
    return _check(tokens, OPTIONS, key, "remove it")


def model_options(blob: bytes) -> str:
    """The options a saved VW model's header holds (VW applies them when it loads the model).

    The header: a length-prefixed version string, a length-prefixed model id, one byte, min and
    max label (float32), bit count, LDA topics, n-gram and skip counts (uint32; railgate never
    sets them), then the length-prefixed option string. ``VWArgsError`` when it is not laid out so.
    """
    try:
        offset = 0
        for _ in range(2):  # version, model id
            (length,) = struct.unpack_from("<I", blob, offset)
            offset += 4 + length
        offset += 1 + 4 + 4 + 4 + 4  # model byte, min/max label, bits, lda
        (ngram,) = struct.unpack_from("<I", blob, offset)
        (skips,) = struct.unpack_from("<I", blob, offset + 4)
        offset += 8
        if ngram or skips:
            raise VWArgsError(
                f"the VW model's header asks for n-grams or skips ({ngram}, {skips}), which railgate never sets"
            )
        (length,) = struct.unpack_from("<I", blob, offset)
        raw = blob[offset + 4 : offset + 4 + length]
    except struct.error:
        raise VWArgsError("the VW model's header is cut short") from None
    if len(raw) != length or length > 65536:
        raise VWArgsError(f"the VW model's option string claims {length} bytes; {len(raw)} are there")
    return raw.rstrip(b"\x00").decode("ascii", "replace")


def check_model_options(blob: bytes, where: str = "the VW model") -> None:
    """``VWArgsError`` unless every option in ``blob``'s header is one railgate's models carry."""
    _check(
        model_options(blob).split(),
        MODEL_OPTIONS,
        where,
        "the model did not come from railgate: train the controller again (a new run)",
    )


def _check(tokens: list[str], allowed: dict[str, str | None], key: str, fix: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, _, inline = token.partition("=") if token.startswith("--") else (token, "", "")
        name = SHORT.get(name, name)
        if name not in allowed:
            what = (
                "a value without its option"
                if not token.startswith("-")
                else "not an option railgate passes to vowpalwabbit"
            )
            raise VWArgsError(
                f"{key}: {token[:60]!r} is {what} (none that names a file, a port or a host; only learning "
                f"options such as --l2, --power_t, -q: controller/rail/vw_args.py); {fix}"
            )
        kind = allowed[name]
        if kind is FLAG:
            if inline:
                raise VWArgsError(f"{key}: {name} takes no value (got {inline[:40]!r}); write it alone")
            out.append(token)
            i += 1
            continue
        value = inline if inline else (tokens[i + 1] if i + 1 < len(tokens) else "")
        if not _fits(name, kind, value):
            raise VWArgsError(f"{key}: {name} takes {kind}, not {value[:40]!r}; give it one (e.g. {_example(kind)})")
        out.extend([token.partition("=")[0] if inline else token, value])
        i += 1 if inline else 2
    return out


def _fits(name: str, kind: str | None, value: str) -> bool:
    if kind == NUMBER:
        return bool(_NUMBER.fullmatch(value))
    if kind == NAMESPACES:
        return bool(_NAMESPACES.fullmatch(value))
    return bool(_NAME.fullmatch(value)) and value in VALUE_NAMES.get(name, {value})


def _example(kind: str | None) -> str:
    return {NUMBER: "1e-6", NAMESPACES: "sa", NAME: "squared"}.get(kind or "", "")
