"""spaCy's English special cases as data: chunk -> positions where its later words start
(``SPECIAL_CASES``), the characters they contain, and a cut list as a bit mask."""

from __future__ import annotations


def _special_cases() -> dict[str, tuple[int, ...]]:
    """English special cases: chunk -> positions where its later tokens start.

    Abbreviations keep their period (``()``), contractions split off their clitic
    ("don't" -> "do n't" is ``(2,)``), a few emoticons and fixed forms stay whole.
    """
    out: dict[str, tuple[int, ...]] = {}

    def add(word: str, tokens: str) -> None:
        cuts, pos = [], 0
        for tok in tokens.split(" ")[:-1]:
            pos += len(tok)
            cuts.append(pos)
        out[word] = tuple(cuts)

    def both_cases(word: str, tokens: str) -> None:
        add(word, tokens)
        add(word[:1].upper() + word[1:], tokens[:1].upper() + tokens[1:])

    abbreviations = (
        "Adm. Ak. Ala. Apr. Ariz. Ark. Aug. Bros. Calif. Co. Colo. Conn. Corp. D.C. Dec. Del. "
        "Dr. E.G. E.g. Feb. Fla. Ga. Gen. Gov. I.E. I.e. Ia. Id. Ill. Inc. Ind. Jan. Jr. Jul. "
        "Jun. Kan. Kans. Ky. La. Ltd. Mar. Mass. Md. Messrs. Mich. Minn. Miss. Mo. Mont. Mr. "
        "Mrs. Ms. Mt. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. Nov. Oct. Okla. Ore. Pa. "
        "Ph.D. Prof. Rep. Rev. S.C. Sen. Sep. Sept. St. Tenn. Va. Wash. Wis. a.m. p.m. co. "
        "e.g. i.e. vs. v.s. ä. ö. ü. °C. °F. °K. °c. °f. °k. and/or w/o C++ 'bout 'cause "
        "'cos 'coz 'cuz 'em 'nuff ol' ol’ :) :( :-) :-( :)) :(( :D :P :p :-D :-P :-p ;) ;-) ;D "
        "=) =( =D 8) 8-) 8D :/ :-/ :o :O :-o :-O :| :-| :* :-* :] :-] :3 <3 </3 <33 ^_^ ^__^ "
        "-_- o_O O_o o.O O.o O.O o.o xD XD ._. ' '' (: ): (; (-: )-: (= XDD xDD :') :'( :’) :’("
    ).split()
    for word in abbreviations:
        add(word, word)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        add(letter + ".", letter + ".")
    for hour in range(1, 13):
        for half in ("am", "pm"):
            add(f"{hour}{half}", f"{hour} {half}")
            add(f"{hour}{half[0]}.m.", f"{hour} {half[0]}.m.")
    for apos in ("'", "’"):
        for clitic in ("s", "d", "ll", "re", "S"):
            add(apos + clitic, apos + clitic)
    for word in ("’", "’’", "‘s", "‘S"):
        add(word, word)
    clitics = {
        "i": "m d ll ve", "you": "d ll re ve", "he": "d ll s", "she": "d ll s", "it": "d ll s",
        "we": "d ll re ve", "they": "d ll re ve", "there": "d ll re s ve", "this": "d ll s",
        "that": "d ll s", "these": "d ll re ve", "those": "d ll re ve", "who": "d ll re s ve",
        "what": "d ll re s ve", "when": "d ll re s ve", "where": "d ll re s ve",
        "why": "d ll re s ve", "how": "d ll re s ve",
    }
    # Without an apostrophe spaCy only splits forms that are not ordinary words.
    real_words = {"its", "ill", "well", "shell", "were", "hell", "whod", "shed"}
    for pron, cls in clitics.items():
        for cl in cls.split():
            for apos in ("'", "’"):
                both_cases(f"{pron}{apos}{cl}", f"{pron} {apos}{cl}")
            if pron + cl not in real_words:
                both_cases(pron + cl, f"{pron} {cl}")
        if "d" in cls.split():
            for apos in ("'", "’"):
                both_cases(f"{pron}{apos}d{apos}ve", f"{pron} {apos}d {apos}ve")
            both_cases(f"{pron}dve", f"{pron} d ve")
        if "ll" in cls.split():
            both_cases(f"{pron}llve", f"{pron} ll ve")
    for i_form in ("I'm", "I’m", "Im", "I'd", "I’d", "I'll", "I’ll", "I've", "I’ve", "Id", "Ive"):
        add(i_form, "I " + i_form[1:])
    add("Ima", "I m a")
    add("ima", "i m a")
    for verb in ("ai are ca could dare did does do had has have is may might must need ought "
                 "sha should was were wo would").split():
        for apos in ("'", "’"):
            both_cases(f"{verb}n{apos}t", f"{verb} n{apos}t")
            both_cases(f"{verb}n{apos}t{apos}ve", f"{verb} n{apos}t {apos}ve")
        both_cases(f"{verb}nt", f"{verb} nt")
        both_cases(f"{verb}ntve", f"{verb} nt ve")
    for modal in ("could", "might", "must", "should", "would"):
        for apos in ("'", "’"):
            both_cases(f"{modal}{apos}ve", f"{modal} {apos}ve")
        both_cases(f"{modal}ve", f"{modal} ve")
    for word, tokens in (("cannot", "can not"), ("gonna", "gon na"), ("gotta", "got ta"),
                         ("let's", "let 's"), ("let’s", "let ’s"), ("y'all", "y' all"),
                         ("y’all", "y’ all"), ("yall", "y all"), ("ma'am", "ma'am"),
                         ("ma’am", "ma’am"), ("o'clock", "o'clock"), ("o’clock", "o’clock"),
                         ("c'mon", "c'm on"), ("c’mon", "c’m on"), ("ain't", "ai n't"),
                         ("doin'", "doin'"), ("goin'", "goin'"), ("havin'", "havin'"),
                         ("nothin'", "nothin'"), ("somethin'", "somethin'"), ("lovin'", "lovin'")):
        both_cases(word, tokens)
    return out


SPECIAL_CASES: dict[str, tuple[int, ...]] = _special_cases()


def cut_mask(cuts) -> int:
    return sum(1 << c for c in cuts)


SPECIAL_CHARS = frozenset("".join(SPECIAL_CASES))


def cut_mask(cuts) -> int:
    return sum(1 << c for c in cuts)


SPECIAL_CHARS = frozenset("".join(SPECIAL_CASES))
