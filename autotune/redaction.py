"""What a secret looks like, by its name and by its value: the one rule every record, export, log and printed line of
script arguments uses (``redact_args``: what is shown; ``secret_arguments``: what a kept file refuses, by name)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import contextvars
import functools
import html
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from urllib.parse import unquote

REDACTED = "<redacted>"

# -- by name -------------------------------------------------------------------------------------------------------
# A name says it holds a secret when one of its words (split at - _ . @ /) ends with token, secret(s), password(s),
# passwd, passphrase, credential(s), auth, authorization, authentication or cookie(s) (--hub_token, --db.password,
# --authorization, --session_cookie), or ends with a kind of key (--apikey, --access_key as one word); or its last
# word is key(s) after anything but a key into data (--api-key, --api_keys, --wandb_key, --key; not --sort_key,
# --text_key, nor --key_column, nor --monkey); or is one of _WORDS (--db-pass, --pw, --creds, --sas_url; not
# --bypass_cache), or sig after another word (--url_sig; --sig alone is a sigma); or holds one of _INSIDE anywhere
# (--passwordfile, --clientsecret, --jwtfile). Not "tokens" (--max_tokens is a length) nor --tokenizer_name; not a
# tokenizer's special tokens (--pad_token, --eos_token); not a name that ends with a count or an id
# (--pad_token_id, --password_length, --token_limit) or a place (--token_file, --secret_name: _PLACES) or starts
# with a quantity (--num_keys, --max_auth) or a switch (--use_auth_token True): their values are not secrets, and a
# real token given to one is still caught by its value.
_ENDS = re.compile(r".*(token|secrets?|passwords?|passwd|passphrase|credentials?|auth|authorization|authentication"
                   r"|cookies?)|(.*(api|access|secret|private|priv|auth|hub|wandb|hf|client|account|master|session"
                   r"|signing|sign|ssh|gpg|pgp|license|encryption|hmac|shared|service|storage))?keys?", re.IGNORECASE)
_KEY = re.compile(r"keys?", re.IGNORECASE)
_WORDS = {"pass", "pwd", "pw", "cred", "creds", "sas", "signature", "dsn", "jwt", "bearer", "otp"}
_QUALIFIED = {"sig"}  # a secret's word only after another (--url_sig, a URL's ?sig=); alone a flag so named is a sigma
_INSIDE = re.compile(r"password|passwd|passphrase|secret|credential|apikey|bearer|jwt", re.IGNORECASE)
MAX_NAME = 200  # characters of a flag's name; a longer one is judged as a value
_WHOLE = {"hf", "pat"}  # only as the whole name: --hf (a Hugging Face token), never --hf_model
_SPECIAL_TOKENS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end", "stop", "image",
                   "audio", "video", "placeholder", "additional"}
_COUNTS = {"id", "ids", "idx", "index", "count", "num", "len", "length", "limit", "budget", "size", "type", "dim",
           "max", "min"}
# a last word that says the value is where a secret is, or what it is called, not the secret (--token_file,
# --hf_token_path, --secret_name, --secrets_dir, --password_env: where secrets belong); the value is still judged by
# what it is, a long random string included
_PLACES = {"file", "files", "path", "paths", "dir", "dirs", "directory", "folder", "env", "var", "variable", "name",
           "mount", "location"}
_QUANTITIES = {"num", "n", "number", "max", "min", "total", "count"}  # a first word: how many (--num_keys 4)
_SWITCHES = {"use", "enable", "disable", "no", "with", "without", "skip", "require", "allow", "ignore"}
# before key(s): a key into data, a batch, a dict or a table (--sort_key loss, --text_key, --primary_key)
_DATA_KEYS = {"sort", "primary", "foreign", "partition", "join", "group", "shard", "cluster", "dict", "column", "col",
              "field", "row", "index", "lookup", "cache", "map", "hash", "sample", "batch", "data", "dataset", "text",
              "label", "input", "output", "target", "prompt", "response", "completion", "chosen", "rejected", "image",
              "audio", "video", "caption", "question", "answer", "context", "message", "messages", "conversation",
              "instruction", "content", "metric", "monitor", "score", "loss", "reward", "eval", "train", "split",
              "state", "config", "attention", "query", "value", "order", "name", "feature", "tensor", "json",
              "result", "source", "src", "tgt", "task", "rng", "prng", "node", "module", "layer", "param"}
# a name whose value is a user:password pair (curl's -u/--user, --login); 1000:1000 (a uid:gid) is not one
_LOGIN_NAMES = {"login", "user", "username", "userpass", "userinfo", "basic"}
_USER_PASSWORD = re.compile(r"[^\s:/@]+:\S+")
# several values after a plural name (argparse's nargs="+": --api_keys k1 k2), each hidden up to the next flag
_PLURAL = re.compile(r".*(keys|secrets|passwords|credentials|creds|cookies|passphrases)", re.IGNORECASE)


# What a name may carry after its meaning: a number or one letter telling several apart (--token2, --api_key2,
# --api-key-b, --hf_token_v2), or the encoding its value is written in (--private_key_pem, --secret_b64): the name is
# judged without them. Not a longer word (--api_key_file, --key_column: those say what the value is).
_SUFFIX = re.compile(r"[a-z]?\d*", re.IGNORECASE)
_FORMATS = {"pem", "der", "b64", "base64", "hex", "str", "string", "raw", "bytes", "value"}


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[-_.@/]", name.lstrip("-+~").rstrip(":")) if w]


def _meaning(name: str) -> list[str]:
    """The lowercased words of ``name`` that say what it holds: a trailing number on each word dropped (token2 ->
    token), then a last word that is only a suffix or an encoding (``_SUFFIX``, ``_FORMATS``)."""
    words = [w.lower().rstrip("0123456789") or w.lower() for w in _words(name)]
    while len(words) > 1 and (_SUFFIX.fullmatch(words[-1]) or words[-1] in _FORMATS):
        words.pop()
    return words


@functools.lru_cache(maxsize=4096)  # a long argument may repeat one name thousands of times ({a:1,a:1,...})
def says_secret(name: str) -> bool:
    """The name rule: ``name`` (a flag such as ``--hub_token`` or ``-p``, a Hydra key such as ``++db.password``)
    names a secret."""
    if name.rstrip(":") == "-p":  # -p PASSWORD (mysql, sshpass); --p stays a probability
        return True
    bare = name.lstrip("-+~").rstrip(":")
    if bare.lower() in _WHOLE:
        return True
    if len(bare) > MAX_NAME:  # no flag is this long (and the words rule stays linear in what it reads)
        return False
    words = _meaning(name)
    if not words or words[-1] in _COUNTS | _PLACES or (len(words) > 1 and words[0] in _QUANTITIES | _SWITCHES):
        return False
    for i, (before, w) in enumerate(zip([""] + words, words)):
        if w == "token" and before in _SPECIAL_TOKENS:
            continue
        if _KEY.fullmatch(w):  # a bare key: a secret's only as the last word, and not a key into data
            if i == len(words) - 1 and before not in _DATA_KEYS:
                return True
            continue
        if _ENDS.fullmatch(w) or w in _WORDS or (i and w in _QUALIFIED) or _INSIDE.search(w):
            return True
    return False


def _user_password(name: str, value: str) -> str | None:
    """Why ``value`` given to ``name`` is a secret as a login's user:password (``--login alice:pw``, ``-u a:b``)."""
    words = _words(name)
    if not words or not (name == "-u" or words[-1].lower() in _LOGIN_NAMES):
        return None
    if _USER_PASSWORD.fullmatch(value) and "://" not in value and not re.fullmatch(r"\d+:\d+", value):
        return "a user:password"
    return None


_NAME = r"[A-Za-z_][\w.@/-]*"
_FLAG = re.compile(rf"(-{{1,2}}{_NAME})(:?)")  # --token, -p, --token: (then its value is the next argument)
_FLAG_VALUE = re.compile(rf"(-{{1,2}}{_NAME})(=|:\s*|\s+)(.*)", re.DOTALL)  # --k=v, --k: v, --k:v, "--k v"
_OVERRIDE = re.compile(rf"([+~]{{0,2}}{_NAME})=(.*)", re.DOTALL)  # Hydra: k=v, +k=v, ++k=v, ~k=v


# -- by value ------------------------------------------------------------------------------------------------------
# Well-known token prefixes, each with the length its issuer gives (so a word such as "sk-learn" is no token):
# Hugging Face (hf_, api_org_), GitHub (ghp_ gho_ ghu_ ghs_ ghr_: github.blog changelog 2021-03-31; github_pat_: its
# fine-grained tokens), GitLab (glpat- and its other token kinds: gitlab-org/gitlab issue 342327), OpenAI and
# Anthropic (sk-, sk-proj-, sk-ant-), Stripe (sk_live_, rk_live_), AWS access key ids (AKIA, ASIA), Slack (xoxb- xoxp-
# xoxa- xoxr- xoxs- xoxe-, xapp-), Google (AIza, ya29.), npm (npm_), PyPI (pypi-), Databricks (dapi).
_PREFIXED = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{30,}|api_org_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9_]{30,}"
    r"|github_pat_[A-Za-z0-9_]{22,}|gl(?:pat|dt|rt|rtr|cbt|ptt|ft|imt|oas|soat|agent)-[A-Za-z0-9_-]{20,}"
    r"|sk-(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Z])[A-Za-z0-9_-]{20,}|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])|xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}"
    r"|AIza[A-Za-z0-9_-]{35}|ya29\.[A-Za-z0-9_-]{20,}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}|dapi[0-9a-f]{32})")
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
# scheme://user:password@host, or //user:password@host without its scheme (a password may be empty only when the
# user name is itself a secret's shape)
# The password may hold / ? # (mongodb://admin:s3cr/et@db: clients split at the last @), up to MAX_URL_PASSWORD
# characters, unless it reads as a port and a path (https://host:8080/@scope/pkg, an npm package's URL).
MAX_URL_PASSWORD = 256
_URL_CREDENTIALS = re.compile(r"(?<![A-Za-z0-9+.-])(?:[A-Za-z][A-Za-z0-9+.-]*:)?//[^\s/?#@:]*:"
                              rf"(?:[^\s/?#@]+|(?!\d*[/?#])[^\s@]{{1,{MAX_URL_PASSWORD}}})@")
# user:password@host without a scheme (redis-cli's and rsync's alice:pw@redis:6379, alice:pw@host:/path): the user
# a word or nothing (:pw@redis:6379, redis's password alone), the password up to MAX_URL_PASSWORD characters
# without / or @, the host a host name with an optional port,
# then the end, a path (host:/srv, host:~/d) or a separator. Not an image's name:tag@sha256:digest (a digest is no
# port), nor git@host:repo (no password), nor an address alone. Possessive (+): neither part can end at the
# character that follows it, so nothing is tried twice (linear in the argument).
_BARE_CREDENTIALS = re.compile(rf"(?<![\w.+%/:@-])[\w.+%-]{{0,256}}+:[^\s/@]{{1,{MAX_URL_PASSWORD}}}+@"
                               r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*(?::\d{1,5})?"
                               r"(?=$|[/\s?#,;'\"}\])]|:[/~]|:$)")
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")  # PEM, OpenSSH, PGP's PRIVATE KEY BLOCK
_BEARER = re.compile(r"\bbearer\s+[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE)
# name=value or name: value inside a value (a URL's query, a connection string, JSON, a header, a Hydra dict
# {user:alice,password:pw}: there the colon needs no space after it), the name a secret's
# The character before a name is looked behind, not taken, so a value that opens another ({"db": {"password": ..}})
# leaves it for the next name; a URL's #fragment and a list's [ open names too.
_PAIR = re.compile(r"""(?:^|(?<=[?&;,\s{(\[#]))["']?([A-Za-z_][\w.-]*)["']?(?:=|:(?=[\s"']))\s*["']?"""
                   r"""[^\s"',;&})]""")
_DICT_PAIR = re.compile(r"""(?<=[{,\[])\s*["']?([A-Za-z_][\w.-]*)["']?\s*:\s*["']?[^\s"',;&})\]]""")
MAX_DECODINGS = 4  # decoding rounds (%2540 -> %40 -> @; &amp;#64; -> &#64; -> @): a value is judged as each reads it
# Long random strings: a run of at least 32 characters of the base64 / base64url alphabets that looks drawn at
# random rather than written: letters of both cases and digits, at most 1 separator (- _ / +) in 10 characters,
# more than 4.0 bits of entropy per character (no string of hex digits has more than 4: hashes, run ids and UUIDs
# pass), and the character class (upper, lower, digit) changing at 40 % or more of its steps (words, CamelCase names
# and model names change far less often). With the exceptions below, random base62 strings of 32 characters are
# caught 94.8 % of the time, of 40 96.9 %; random base64url of 43 (32 bytes) 96.5 %, base64 of 40 95.9 % (20,000 each:
# bench/secret_rule.py). Shorter secrets, hex secrets and ones that read like words go by: the name and prefix rules
# are what catch those.
# Then what is written, not drawn, though it has these shapes:
# - a name written in words (CamelCase run names: gpt2Medium345MFinetunedOnWikiText103v2): each word starts with
#   one capital and goes on in lowercase, so an uppercase letter right after another letter is rare (at most
#   MAX_CAPITAL_AFTER_LETTER of its letters; random text: about half) and its words average MIN_WORD_LETTERS letters
#   or more (random text: about 1.7);
# - a digest by its label: an SRI value (sha256-, sha384-, sha512-), sha256: or sha256= before it;
# - a digest by its shape: standard base64 (no - or _) of a digest's length with that length's = signs (MD5, SHA-1,
#   SHA-224, SHA-256, SHA-384, SHA-512: 24, 28, 40, 44, 64, 88 characters with 2, 1, 2, 1, 0, 2 of them), as `base64`,
#   openssl and SRI write them. The price: a secret of exactly such a shape (32 random bytes in standard base64,
#   a 64-character base62 token) goes by unless its name says secret;
# - an IPFS CID: v0 is Qm and 44 base58 characters (a SHA-256 multihash); v1 (bafy...) is lowercase base32 already.
_RUN = re.compile(r"[A-Za-z0-9+/_-]{32,}")
MIN_RANDOM_CHARS = 32
MIN_ENTROPY_BITS = 4.0
MIN_CLASS_CHANGES = 0.4
MAX_SEPARATORS = 0.1
MAX_CAPITAL_AFTER_LETTER = 0.25
MIN_WORD_LETTERS = 2.2
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+")
_MAGNITUDE = re.compile(r"(?<=\d)[KMBTkmbt](?=[A-Z0-9]|$)")
_DIGEST_LABEL = re.compile(r"(?:sha(?:1|224|256|384|512)|md5|blake2[bs]?)[-:=]$", re.IGNORECASE)
_DIGEST_LENGTHS = {24: 2, 28: 1, 40: 2, 44: 1, 64: 0, 88: 2}  # base64 of 16, 20, 28, 32, 48, 64 bytes: its = signs
_CID_V0 = re.compile(r"Qm[1-9A-HJ-NP-Za-km-z]{44}")
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_MULTIHASH_CODES = {0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x1B}  # sha1, sha2-256/512, sha3-*, keccak-256


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _kind(ch: str) -> int:
    return 0 if ch.isupper() else 1 if ch.islower() else 2


def _written_in_words(alnum: str) -> bool:
    """A CamelCase name: few capitals right after a letter, words of MIN_WORD_LETTERS letters or more on average. A
    magnitude after a number (345M, 8B, 1k) belongs to the number."""
    alnum = _MAGNITUDE.sub("0", alnum)
    letters = sum(c.isalpha() for c in alnum)
    capitals = sum(a.isalpha() and b.isupper() for a, b in zip(alnum, alnum[1:]))
    words = _WORD.findall(alnum)
    return capitals <= MAX_CAPITAL_AFTER_LETTER * letters and letters >= MIN_WORD_LETTERS * len(words)


def looks_random(run: str) -> bool:
    """The entropy rule on one run of the base64 alphabets (see above)."""
    alnum = re.sub(r"[^A-Za-z0-9]", "", run)
    if len(run) < MIN_RANDOM_CHARS or (len(run) - len(alnum)) > MAX_SEPARATORS * len(run):
        return False
    if not (any(c.isupper() for c in alnum) and any(c.islower() for c in alnum) and any(c.isdigit() for c in alnum)):
        return False
    if _entropy(run) <= MIN_ENTROPY_BITS:
        return False
    changes = sum(_kind(a) != _kind(b) for a, b in zip(alnum, alnum[1:]))
    return changes >= MIN_CLASS_CHANGES * (len(alnum) - 1) and not _written_in_words(alnum)


def _digest_or_cid(text: str, m: re.Match) -> bool:
    """The run ``m`` of ``text`` is a digest or a content id by its label or shape (see above)."""
    run, before = m.group(), text[max(0, m.start() - 8):m.start()]
    label = re.match(r"(?:sha(?:1|224|256|384|512)|md5|blake2[bs]?)-", run, re.IGNORECASE)
    if label or _DIGEST_LABEL.search(before):
        return True
    padding = len(text[m.end():m.end() + 2]) - len(text[m.end():m.end() + 2].lstrip("="))
    url, standard = re.search(r"[-_]", run), re.search(r"[+/]", run)
    # base64url too when the encoder wrote the padding (a token generator strips it: secrets.token_urlsafe)
    if _DIGEST_LENGTHS.get(len(run) + padding) == padding and not (url and (standard or not padding)):
        return True
    return bool(_CID_V0.fullmatch(run)) or _is_multihash(run)


def _b58decode(text: str) -> bytes | None:
    n = 0
    for c in text:
        i = _B58.find(c)
        if i < 0:
            return None
        n = n * 58 + i
    zeros = len(text) - len(text.lstrip("1"))
    return b"\0" * zeros + n.to_bytes((n.bit_length() + 7) // 8, "big")


def _multihash_bytes(raw: bytes) -> bool:
    """``raw`` is a multihash (sha1, sha2-256, sha2-512, sha3, blake2b-256: its code, then its length, then exactly
    that many bytes), or a CIDv1 around one (version 1, a one- or two-byte codec)."""
    for start in (0, 2, 3):
        if start and (not raw or raw[0] != 1):
            break
        body = raw[start:]
        if len(body) > 2 and body[0] in _MULTIHASH_CODES and body[1] == len(body) - 2 and body[1] >= 20:
            return True
    return False


def _is_multihash(run: str) -> bool:
    """A run that decodes (base58btc, multibase z; base64 or base64url, multibase m or u) to a multihash or a CID: a
    content address by its structure, which random text meets about once in 2**24."""
    if len(run) > 200:
        return False
    candidates = [_b58decode(run[1:] if run[0] == "z" else run)]
    for body in (run[1:] if run[0] in "mu" else run, run):
        try:
            candidates.append(base64.b64decode(body.replace("-", "+").replace("_", "/") + "=" * (-len(body) % 4),
                                               validate=True))
        except (binascii.Error, ValueError):
            continue
    return any(raw is not None and _multihash_bytes(raw) for raw in candidates)


_ESCAPE = re.compile(r"\\(?:x([0-9A-Fa-f]{2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|/)")


def _unescape(text: str) -> str:
    """Backslash escapes as C, Python, JSON and shells write them (``\\x40``, ``\\u0040``, ``\\U00000040``, ``\\/``)."""
    def char(m: re.Match) -> str:
        code = m.group(1) or m.group(2) or m.group(3)
        return "/" if code is None else chr(min(int(code, 16), 0x10FFFF))
    return _ESCAPE.sub(char, text)


def plain(text: str) -> str:
    """``text`` as a reader sees it: compatibility forms folded (NFKC: fullwidth ＠ and ｈｆ＿ are @ and hf_),
    invisible format characters (zero-width spaces, bidi marks) dropped, every kind of dash a hyphen."""
    text = unicodedata.normalize("NFKC", text) if not text.isascii() else text
    if text.isascii():
        return text
    return "".join("-" if unicodedata.category(c) == "Pd" else c for c in text
                   if unicodedata.category(c) != "Cf")


def _decoded(text: str) -> str:
    """One round of every decoding a value may be written in: percent-encoding, HTML entities (``&#64;``,
    ``&commat;``), backslash escapes, compatibility forms (``plain``)."""
    if "%" in text:
        text = unquote(text)
    if "&" in text:
        text = html.unescape(text)
    if "\\" in text:
        text = _unescape(text)
    return plain(text)


# a run of either alphabet, and a run without / (a path's or URL's segment: /runs/YWxpY2U6cHc=/ckpt)
_BASE64_RUNS = (re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}"), re.compile(r"[A-Za-z0-9+_-]{8,}={0,2}"))
MIN_DECODED_TEXT = 6  # characters of text a base64 run must decode to before it is read as text


def _base64_texts(text: str) -> Iterator[str]:
    """Each run of ``text`` in base64 or base64url that decodes to printable text (HTTP Basic's user:password, a
    wrapped token or config): random bytes (a digest, a key) almost never do."""
    for m in (m for pattern in _BASE64_RUNS for m in pattern.finditer(text)):
        run = m.group().rstrip("=")
        if len(run) % 4 == 1:
            continue
        padded = run + "=" * (-len(run) % 4)
        try:
            raw = base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
            decoded = raw.decode("utf-8")
        except (binascii.Error, ValueError):
            continue
        if len(decoded) >= MIN_DECODED_TEXT and decoded.isprintable():
            yield decoded


def _readings(text: str) -> Iterator[str]:
    """``text`` as written, then as each round of decoding reads it (``_decoded``: percent-encoding, HTML entities,
    backslash escapes, fullwidth and invisible characters; at most MAX_DECODINGS rounds, so a URL inside another
    URL's query is read too), and without the quotes around it ('+db.password=pw' typed inside quotes that reached
    the script)."""
    seen = text
    yield text
    for _ in range(MAX_DECODINGS):
        decoded = _decoded(seen)
        if decoded == seen:
            break
        seen = decoded
        yield decoded
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        yield text[1:-1]


def _judged(text: str, by_entropy: bool) -> str | None:
    if _PEM.search(text):
        return "a private key"
    if "@" in text and (_URL_CREDENTIALS.search(text) or _BARE_CREDENTIALS.search(text)):
        return "URL credentials"
    if _JWT.search(text):
        return "a JWT"
    if _PREFIXED.search(text):
        return "a token by its prefix"
    if _BEARER.search(text):
        return "a bearer token"
    for m in (*_PAIR.finditer(text), *_DICT_PAIR.finditer(text)):
        if says_secret(m.group(1)) or m.group(1).lower() in _QUALIFIED:  # ?sig=: an Azure SAS URL's signature
            return f"{m.group(1)}=... inside it"
    if by_entropy and any(looks_random(m.group()) and not _digest_or_cid(text, m) for m in _RUN.finditer(text)):
        return "a long random string"
    return None


_IN_WORDS: contextvars.ContextVar[bool] = contextvars.ContextVar("in_words", default=False)


def _arguments_inside(text: str) -> str | None:
    """A value that is itself a command line or a string of arguments (``--args "--lr 1 --password pw"``,
    ``--cmd "mysql -u root -ppw"``): its words judged as arguments, once (not again inside a word). Only what a
    flag or key says counts (a free text's "Bearer of news" is no header); what a value is, is judged on the
    whole."""
    if _IN_WORDS.get() or not any(c.isspace() for c in text):
        return None
    words = text.split()
    if len(words) < 2:
        return None
    inside = _IN_WORDS.set(True)
    try:
        found = [s for s in secret_arguments(words) if not s.name.startswith("argument ")]
    finally:
        _IN_WORDS.reset(inside)
    return f"{found[0].name} inside it" if found else None


def secret_value(text: str, by_entropy: bool = True) -> str | None:
    """The value rule: why ``text`` (one argument, or the value part of one) holds a secret whatever its name, or
    None. Judged as written and as every decoding reads it (``_readings``: percent-encoding, repeatedly, so a URL
    inside another URL's query is read too; surrounding quotes). ``by_entropy`` False: the value's name says what it
    is (a name, a path, a digest: ``names_a_written_value``), so a long random-looking string in it is no secret;
    every other rule still applies."""
    for reading in _readings(text):
        why = _judged(reading, by_entropy) or _arguments_inside(reading)
        if why is not None:
            return why
    for decoded in _base64_texts(text):  # base64 of text: judged as that text, and a user:password is HTTP Basic's
        if _USER_PASSWORD.fullmatch(decoded) and not re.fullmatch(r"[\d:.]+", decoded):
            return "a user:password in base64"
        why = _judged(decoded, by_entropy=False)
        if why is not None:
            return f"{why} in base64"
    return None


# A name that says its value is written or computed, not a secret: a name or title, a path, an id, a digest. Its
# value is not judged by the long-random-string rule (a run name, a checksum); a token prefix, URL credentials, a
# JWT or a key=value pair inside it still are.
_WRITTEN = {"name", "names", "title", "tag", "tags", "label", "run", "exp", "experiment", "project", "group", "job",
            "dir", "path", "file", "folder", "id", "uuid", "revision", "commit", "sha", "checksum", "digest", "hash",
            "md5", "integrity", "etag", "cid", "version"}


def names_a_written_value(name: str) -> bool:
    """``name`` (a flag or key that does not say secret) says its value is written or computed (``_WRITTEN``)."""
    words = _meaning(name)
    # a secret's place (--token_file) is no written value: a random string given to it is judged as one
    return bool(words) and words[-1] in _WRITTEN and not says_secret("--" + "_".join(words[:-1]) if words[:-1] else "")


# -- what the user says is no secret ------------------------------------------------------------------------------
_NOT_SECRET: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("not_secret", default=frozenset())
_NOT_SECRET_VALUES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar("not_secret_values",
                                                                                    default=frozenset())


def _bare(name: str) -> str:
    return name.lstrip("-+~").rstrip(":").lower()


@contextlib.contextmanager
def declared_not_secret(names: Iterable[str]) -> Iterator[None]:
    """While inside: the values of these flags or keys (``--run_name``, ``run_name``, ``+exp.sha``), or these exact
    values (a positional argument), are no secret (``--not_secret NAME``); a flag so named still keeps the value of
    a flag whose own name says secret (--hub_token cannot be declared), and a value that says itself what it is (a
    token's prefix, a URL's password, a private key, a JWT: ``says_itself``) stays hidden."""
    names = [n for n in names if n]
    token, values = _NOT_SECRET.set(frozenset(_bare(n) for n in names)), _NOT_SECRET_VALUES.set(frozenset(names))
    try:
        yield
    finally:
        _NOT_SECRET.reset(token)
        _NOT_SECRET_VALUES.reset(values)


def _declared(name: str | None, value: str) -> bool:
    """The user said the value of ``name`` (by the name, any case, dashes or not), or ``value`` itself (exactly), is
    no secret."""
    declared = _NOT_SECRET.get()
    return bool(declared) and ((name is not None and _bare(name) in declared) or value in _NOT_SECRET_VALUES.get())


# -- arguments -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Secret:
    """One argument that holds a secret: its place, how a refusal names it (never its value) and how it is shown."""

    index: int
    name: str  # the flag or key ("--hub_token", "db.password"), else "argument N"
    why: str  # "" when the name says it; else what the value looks like
    shown: str
    more: bool = False  # a further value of the same plural flag (--api_keys k1 k2): named once with the first


# mysql's -pPASSWORD: a value attached to -p is a secret whatever it is (so -p8080 too, as -p 8080 already was)
_ATTACHED = re.compile(r"-p(?![=:])(.+)", re.DOTALL)
_ATTACHED_LOGIN = re.compile(r"-u(?![=:])(.+)", re.DOTALL)  # curl's -ualice:pw (-uroot, -unbuffered: no password)
_BEARER_END = re.compile(r"\bbearer:?\s*$", re.IGNORECASE)  # "Bearer" (or "Authorization: Bearer"), its token next
_HEADER_NAME = re.compile(r"([A-Za-z_][\w.-]*):\s*")  # "X-Api-Key:" alone (curl -H), its value next


def _next_is(a: str) -> str | None:
    """What the argument after ``a`` is, when ``a`` says it is a secret without being a flag: a bearer token after
    "Bearer", or the value of a header or key whose name says secret ("X-Api-Key:", "password:")."""
    if _BEARER_END.search(a):
        return "a bearer token"
    header = _HEADER_NAME.fullmatch(a)
    return f"{header.group(1)}: its value" if header and says_secret(header.group(1)) else None


def _by_value(name: str | None, value: str) -> str | None:
    """Why ``value`` (given to ``name``, a flag or key that does not say secret, or None) is a secret by what it
    is: a login's user:password, or the value rule (``secret_value``: the long-random-string rule only where the
    name does not say the value is written: ``names_a_written_value``); None when it is not, or when the user said
    it is not (``declared_not_secret``) and it does not say itself what it is (``says_itself``)."""
    if _declared(name, value):
        return says_itself(value)
    login = _user_password(name, value) if name else None
    return login or secret_value(value, by_entropy=not (name and names_a_written_value(name)))


_ITSELF = ((_PEM, "a private key"), (_URL_CREDENTIALS, "URL credentials"), (_JWT, "a JWT"),
           (_PREFIXED, "a token by its prefix"))


def says_itself(value: str) -> str | None:
    """What ``value`` is by its own form, as any decoding reads it, whatever the user says of it: a private key, a
    URL with a password, a JWT, an issuer's token prefix. ``--not_secret`` lifts the rules that judge by shape (a
    long random string, a login's user:password, user:pw@host without a scheme) or by a name inside the value,
    which an ordinary value can meet; not these, which no checksum or run name has."""
    for reading in _readings(value):
        for pattern, why in _ITSELF:
            if pattern.search(reading):
                return why
    return None


def _quoted(i: int, a: str, before: str | None) -> Secret | None:
    """An argument inside quotes that reached the script as they are ('+db.password=pw'): judged without them
    (``before``: the flag just before it, whose value it may be)."""
    if len(a) < 3 or a[0] != a[-1] or a[0] not in "'\"":
        return None
    inner = secret_arguments([a[1:-1]])
    if not inner or (inner[0].why and _declared(before, a) and not says_itself(a)):
        return None
    name = before or f"argument {i + 1}" if inner[0].name == "argument 1" else inner[0].name
    return Secret(i, name, inner[0].why, a[0] + inner[0].shown + a[-1])


def secret_arguments(argv: list[str] | tuple[str, ...]) -> list[Secret]:
    """Every argument of ``argv`` that holds a secret, by the name rule or the value rule, in any syntax: ``--k v``,
    ``--k=v``, ``--k: v``, ``--k:v``, ``-k v``, ``"--k v"`` as one argument, ``"--k=" v``, ``-pv``, ``-uuser:pw``,
    Hydra's ``k=v``, ``+k=v``, ``++k=v``, ``+k={a:1,password:pw}``, any of them inside quotes; after a plural name
    (``--api_keys``), every value up to the next flag; after ``Bearer`` or a secret's header (``X-Api-Key:``), its
    value."""
    found: list[Secret] = []
    flag = None  # the flag alone just before this argument (``--hub_token``, ``-p``, ``--token:``), if any
    more = False  # this argument may be a further value of a plural secret flag (then it may not start with -)
    follows = None  # the argument before said this one is a secret ("Bearer", "X-Api-Key:"): what it is
    for i, a in enumerate(plain(str(a)) for a in argv):  # judged as a reader sees it (fullwidth, zero-width)
        before, further, flag, more = flag, more, None, False
        token, follows = follows, _next_is(a)
        if before is not None and not a.startswith("-" if further else "--"):  # its value (which may start with -)
            why = "" if says_secret(before) else _user_password(before, a) if not _declared(before, a) else None
            if why is not None:
                found.append(Secret(i, before, why, REDACTED, further))
                flag, more = (before, True) if why == "" and _PLURAL.fullmatch(_meaning(before)[-1]) else (None, False)
                continue
        if token and not a.startswith("-"):
            found.append(Secret(i, f"argument {i + 1}", token, REDACTED))
            continue
        if _ATTACHED.fullmatch(a):
            found.append(Secret(i, "-p", "", "-p" + REDACTED))
            continue
        login = _ATTACHED_LOGIN.fullmatch(a)
        if login and _user_password("-u", login.group(1)) and not _declared("-u", login.group(1)):
            found.append(Secret(i, "-u", "a user:password", "-u" + REDACTED))
            continue
        quoted = _quoted(i, a, before)
        if quoted is not None:
            found.append(quoted)
            continue
        alone, named = _FLAG.fullmatch(a), _FLAG_VALUE.fullmatch(a) or _OVERRIDE.fullmatch(a)
        if named is not None and named.re is _OVERRIDE and not named.group(2).strip("="):  # base64 padding, no k=v
            named = None
        if alone:
            flag = alone.group(1) + alone.group(2)
            why = None if says_secret(flag) else says_itself(a) if _declared(None, a) else secret_value(a)
        elif named:
            name, sep, value = named.group(1), named.group(2) if named.re is _FLAG_VALUE else "=", named.groups()[-1]
            if named.re is _FLAG_VALUE and not value.strip():  # "--token=" "v": its value is the next argument
                flag = name
                continue
            sep = " " if sep.isspace() else sep
            why = "" if says_secret(name) else _by_value(name, value)
            itself = secret_value(name.lstrip("-+~"))  # the part before = may be the secret (a token, base64 text)
            if itself is not None:
                found.append(Secret(i, f"argument {i + 1}", itself, REDACTED))
                continue
            if why is not None:
                found.append(Secret(i, name, why, f"{name}{sep}{REDACTED}"))
                if why == "" and named.re is _FLAG_VALUE and _PLURAL.fullmatch(_meaning(name)[-1]):
                    flag, more = name, True  # --api_keys=k1 k2
            continue
        else:
            why = _by_value(before, a)
        if why is not None:  # a positional value, or a flag that is itself a token (--ghp_...)
            found.append(Secret(i, before if before and not alone else f"argument {i + 1}", why, REDACTED))
            flag = None
    # an argument judged as a reader sees it (plain) is shown whole as <redacted>: its name as typed (fullwidth,
    # zero-width) is not the name shown, and a line shows only what the script received
    raw = [str(a) for a in argv]
    return [s if plain(raw[s.index]) == raw[s.index] else Secret(s.index, s.name, s.why, REDACTED, s.more)
            for s in found]


def redact_args(argv: list[str] | tuple[str, ...]) -> list[str]:
    """``argv`` with every secret (``secret_arguments``) shown as ``<redacted>`` and its flag or key kept: what records,
    printed commands and logs show. The process itself still receives ``argv`` as it was."""
    out = [str(a) for a in argv]
    for s in secret_arguments(argv):
        out[s.index] = s.shown
    return out


def secret_flags(argv: list[str] | tuple[str, ...]) -> list[str]:
    """How a refusal names each secret argument: its flag or key (``--hub_token``), with what its value looks like
    when the name alone does not say it (``--url (URL credentials)``); never the value."""
    return [s.name + (f" ({s.why})" if s.why else "") for s in secret_arguments(argv) if not s.more]


def where_secrets_belong(job_secret_variable: str) -> str:
    """What a refusal says instead of the secret: where secrets belong (``job_secret_variable``: the launcher's
    variable for the nodes' secret, rundir.layout.JOB_SECRET_ENV)."""
    return ("secrets belong in a Kubernetes Secret or an environment variable the script reads, never in an argument "
            f"(autotune's own job secret: ${job_secret_variable} or --job_secret_file)")
