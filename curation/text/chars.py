"""Character sets of the text measurements and spaCy's English rules, and the names of the
class bits the word splitter gives each character (a light module: no tables, no compiled code;
``curation.stages.base`` reads ``PY_WHITESPACE`` and ``re2_class`` from here)."""

from __future__ import annotations

import pyarrow as pa

def expand(ranges: str) -> str:
    """``"a-c x"`` style spec -> the characters it names (code points as hex)."""
    out = []
    for item in ranges.split():
        lo, _, hi = item.partition("-")
        out.extend(chr(c) for c in range(int(lo, 16), int(hi or lo, 16) + 1))
    return "".join(out)


#: Sentence-ending marks across scripts (the set datatrove calls ``TERMINAL_PUNCTUATION``;
#: FineWeb's line-punctuation rule and our sentence splitter use it).
TERMINAL_PUNCTUATION: frozenset[str] = frozenset(
    expand(
        "21 2e 3f 589 61d-61f 6d4 700-702 7f9 837 839 83d 83e 964 965 104a 104b 1362 1367 1368"
        " 166e 1735 1736 1803 1809 1944 1945 1aa8-1aab 1b5a 1b5b 1b5e 1b5f 1b7d 1b7e 1c3b 1c3c"
        " 1c7e 1c7f 203c 203d 2047-2049 2e2e 2e3c 2e53 2e54 3002 a4ff a60e a60f a6f3 a6f7 a876"
        " a877 a8ce a8cf a92f a9c8 a9c9 aa5d-aa5f aaf0 aaf1 abeb fe52 fe56 fe57 ff01 ff0e ff1f"
        " ff61 10a56 10a57 10f55-10f59 10f86-10f89 11047 11048 110be-110c1 11141-11143 111c5"
        " 111c6 111cd 111de 111df 11238 11239 1123b 1123c 112a9 1144b 1144c 115c2 115c3"
        " 115c9-115d7 11641 11642 1173c-1173e 11944 11946 11a42 11a43 11a9b 11a9c 11c41 11c42"
        " 11ef7 11ef8 11f43 11f44 16a6e 16a6f 16af5 16b37 16b38 16b44 16e98 1bc9f 1da88"
    )
)

#: Characters datatrove treats as punctuation when deciding that a word is a "symbol word":
#: ASCII and CJK punctuation, control characters (not tab/newline) and the terminal marks.
PUNCTUATION: frozenset[str] = frozenset(
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + expand("0-8 b-c d-1f 7f-9f")
) | TERMINAL_PUNCTUATION

#: What Python's ``str.isspace`` calls whitespace (``str.strip``/``str.split`` use it).
PY_WHITESPACE = expand("9-d 1c-20 85 a0 1680 2000-200a 2028 2029 202f 205f 3000")


def re2_class(chars) -> str:
    """The characters as the body of an RE2 character class (every one escaped)."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in sorted(set(chars)))


QUOTES = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉〈〉⟦⟧"
RULE_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
CURRENCY = "$£€¥฿₽﷼₴" + expand("20a0-20bf")
UNITS = (
    "km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz "
    "m/s km/h kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K % км км² км³ м м² м³ дм дм² "
    "дм³ см см² см³ мм мм² мм³ нм кг г мг м/с км/ч кПа Па мбар Кб КБ кб Мб МБ мб Гб ГБ гб Тб "
    "ТБ тб"
).split()
URL_RE = (
    r"^(?:[\w+.\-][\w+.\-]+://)?(?:[^\s@]+(?::\S*)?@)?"
    r"(?:[0-9][0-9]?[0-9]?(?:\.[0-9][0-9]?[0-9]?){3}|"
    r"(?:(?:[A-Za-z0-9\x{a1}-\x{ffff}][A-Za-z0-9\x{a1}-\x{ffff}_\-]*)?"
    r"[A-Za-z0-9\x{a1}-\x{ffff}]\.)+\p{Ll}\p{Ll}+)(?::[0-9][0-9]+)?(?:[/?#]\S*)?$"
)


UNIT_STRINGS = pa.array(UNITS + list(CURRENCY) + ["+"])

# ---------------------------------------------------------------------------------------------
# Character class bits. Every code point gets the classes of spaCy's rules (``char_flags`` in
# ``curation.text.classes``); every byte of the text gets a byte class (a multi-byte character's
# bytes carry its code point's). The compiled loops (``curation.text.kernels``) read these as
# constants.

#: code point classes, one bit each
SPACE = 1 << 0  # str.isspace
PREFIX = 1 << 1  # may be stripped from a chunk's start (opening punctuation, quotes, currency, symbols)
SUFFIX = 1 << 2  # may be stripped from a chunk's end
DIGIT = 1 << 3  # 0-9
LOWER = 1 << 4  # Unicode category Ll or Lo
UPPER = 1 << 5  # Unicode category Lu or Lo
ALPHA = 1 << 6  # str.isalpha
QUOTE = 1 << 7  # in QUOTES
PUNCT = 1 << 8  # in RULE_PUNCT
DOT_AFTER = 1 << 9  # "%²-+|": a single "." after one is a suffix
OTHER_SYMBOL = 1 << 10  # Unicode category So (an infix, a prefix and a suffix)
INFIX_SYMBOL = 1 << 11  # ":<>=/": an infix between letters or digits and a letter
DEGREE_LETTER = 1 << 12  # "FfCcKk": the letter of °F, °C, °K (then "." is a suffix)
HYPHEN = 1 << 13  # "-–—~": an infix between a letter or digit and a letter
OPERATOR = 1 << 14  # "+-*^": an infix between digits
NEEDS_RULES = 1 << 15  # some rule looks at it: a chunk without one is a single word
IN_SPECIAL_CASE = 1 << 16  # occurs in a special case string

#: byte classes, one bit each
BYTE_SPACE = 1 << 0  # its character is SPACE
BYTE_NEEDS_RULES = 1 << 1  # NEEDS_RULES
BYTE_PUNCTUATION = 1 << 2  # in PUNCTUATION (datatrove's symbol-word set)
BYTE_LETTER = 1 << 3  # str.isalpha
BYTE_UNICODE_PUNCT = 1 << 4  # Unicode category P* (spaCy's is_punct)
BYTE_TERMINAL = 1 << 5  # in TERMINAL_PUNCTUATION
BYTE_DIGIT = 1 << 6  # 0-9
BYTE_PREFIX = 1 << 7  # PREFIX
BYTE_SUFFIX = 1 << 8  # SUFFIX
BYTE_LOWER = 1 << 9  # LOWER
BYTE_UPPER = 1 << 10  # UPPER
BYTE_DOT_AFTER = 1 << 11  # DOT_AFTER
