"""Language codes as the index and the langid stage write them: ISO 639-3 <-> 639-1 (a leaf: data
only, read by curation.quality.langid and by the WARC index builder in curation.io)."""

from __future__ import annotations

# ISO 639-3 -> 639-1 for the 184 languages that have a two-letter code (from Debian's
# iso-codes, iso_639-3.json), packed as "aaraa abkab ...": three letters, then two.
ISO3_TO_1: dict[str, str] = {w[:3]: w[3:] for w in """
aaraa abkab afraf akaak amham araar argan asmas avaav aveae aymay azeaz bakba bambm belbe benbn
bisbi bodbo bosbs brebr bulbg catca cescs chach chece chucu chvcv corkw cosco crecr cymcy danda
deude divdv dzodz ellel engen epoeo estet euseu eweee faofo fasfa fijfj finfi frafr fryfy fulff
glagd glega glggl glvgv grngn gujgu hatht hauha hbssh hebhe herhz hinhi hmoho hrvhr hunhu hyehy
iboig idoio iiiii ikuiu ileie inaia indid ipkik islis itait javjv jpnja kalkl kankn kasks katka
kaukr kazkk khmkm kikki kinrw kirky komkv konkg korko kuakj kurku laolo latla lavlv limli linln
litlt ltzlb lublu luglg mahmh malml marmr mkdmk mlgmg mltmt monmn mrimi msams myamy nauna navnv
nblnr ndend ndong nepne nldnl nnonn nobnb norno nyany ocioc ojioj orior ormom ossos panpa plipi
polpl porpt pusps quequ rohrm ronro runrn rusru sagsg sansa sinsi slksk slvsl smese smosm snasn
sndsd somso sotst spaes sqisq srdsc srpsr sswss sunsu swasw swesv tahty tamta tattt telte tgktg
tgltl thath tirti tonto tsntn tsots tuktk turtr twitw uigug ukruk urdur uzbuz venve vievi volvo
wlnwa wolwo xhoxh yidyi yoryo zhaza zhozh zulzu
""".split()}
ISO1_TO_3 = {two: three for three, two in ISO3_TO_1.items()}


def iso639_3(code: str) -> str | None:
    """The ISO 639-3 code of an ISO 639-1 one (``sv`` -> ``swe``), None if it has none."""
    return ISO1_TO_3.get(code)
