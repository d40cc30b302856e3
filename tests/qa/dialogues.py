"""Generated payment and identity dialogues, for measuring redaction with cases its rules were not written
from: a grammar of each kind x ways to ask x ways to say the value (digits, words, mixed, grouped, in 1-5
chunks with backchannels, after digressions, read back, corrected) x ASR damage, and negatives (numbers
QA must keep readable). Written independently of pipeline/qa: its own digit words, its own checks.

A dialogue is a list of turns (leg, text, start/end ms) and what must not survive in which turns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

DIGIT_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = ["ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
         "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
# Any of these left in a turn that held a sensitive number is a digit given away.
NUMBER_WORDS = {*DIGIT_WORDS, *TEENS, *TENS[2:], "oh", "double", "triple", "hundred", "thousand"}

BACKCHANNELS = ["mm hmm", "okay", "go ahead", "got it", "yes", "uh huh", "okay go on", "right", "perfect",
                "and the next", "yep", "mm-hmm okay"]
DIGRESSIONS = [
    ("customer", "sorry, one moment"), ("customer", "hold on, let me grab my wallet"),
    ("agent", "no problem, take your time"), ("customer", "sorry my dog is barking, hold on"),
    ("customer", "just a second, I have it here somewhere"), ("agent", "sure, no rush"),
    ("customer", "okay I found it"), ("customer", "sorry about that"), ("agent", "are you still there"),
    ("customer", "yes sorry, I'm here"), ("customer", "bear with me"), ("agent", "that's fine"),
]
CLOSINGS = ["Thank you, that's all verified. Is there anything else I can help you with today?",
            "Perfect, your payment went through. Is there anything else?",
            "Great, you're all set. Anything else I can do for you?"]


@dataclass
class Dialogue:
    kind: str
    turns: list[tuple[str, str]]  # (leg, text)
    secret_turns: set[int] = field(default_factory=set)  # turns that held the value
    secret_words: set[str] = field(default_factory=set)  # non-number words of the value (streets, passwords)
    negative: bool = False


def luhn_digit(partial: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(partial)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return str((10 - total % 10) % 10)


def card_number(rng: random.Random) -> str:
    prefix, length = rng.choice([("4", 16), ("51", 16), ("55", 16), ("2221", 16), ("37", 15), ("6011", 16),
                                 ("4", 13), ("35", 16), ("6", 19)])
    body = prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1))
    return body + luhn_digit(body)


def routing_number(rng: random.Random) -> str:
    while True:
        body = "".join(rng.choice("0123456789") for _ in range(8))
        for last in "0123456789":
            digits = body + last
            if sum(int(d) * w for d, w in zip(digits, (3, 7, 1) * 3, strict=True)) % 10 == 0 and digits[0] in "0123":
                return digits


def ssn(rng: random.Random) -> str:
    area = rng.choice([n for n in range(1, 900) if n != 666])
    return f"{area:03d}{rng.randint(1, 99):02d}{rng.randint(1, 9999):04d}"


def two_digit_words(n: int) -> str:
    if n < 10:
        return DIGIT_WORDS[n]
    if n < 20:
        return TEENS[n - 10]
    return TENS[n // 10] + ("" if n % 10 == 0 else " " + DIGIT_WORDS[n % 10])


def say_digits(digits: str, rng: random.Random, style: str) -> str:
    """One group of digits as a caller says it and ASR writes it."""
    if style == "numerals":
        return digits
    if style == "pairs" and len(digits) % 2 == 0:
        parts = []
        for i in range(0, len(digits), 2):
            pair = digits[i:i + 2]
            parts.append(("oh " + DIGIT_WORDS[int(pair[1])]) if pair[0] == "0" else two_digit_words(int(pair)))
        return " ".join(parts)
    words = []
    i = 0
    while i < len(digits):
        d = digits[i]
        run = 1
        while i + run < len(digits) and digits[i + run] == d and run < 3:
            run += 1
        if style == "words" and run >= 2 and rng.random() < 0.6:
            words.append(("double " if run == 2 else "triple ") + DIGIT_WORDS[int(d)])
            i += run
            continue
        if d == "0" and rng.random() < 0.5:
            words.append("oh")
        elif style == "mixed" and rng.random() < 0.5:
            words.append(d)
        else:
            words.append(DIGIT_WORDS[int(d)])
        i += 1
    return " ".join(words)


def damage(text: str, rng: random.Random) -> str:
    """What ASR does to numbers said on a phone line: four/for, two/to, zero/oh, a split group."""
    out = []
    for word in text.split():
        r = rng.random()
        if word == "four" and r < 0.3:
            out.append("for")
        elif word == "two" and r < 0.3:
            out.append("to")
        elif word == "zero" and r < 0.3:
            out.append("oh")
        elif word.isdigit() and len(word) == 4 and r < 0.2:
            out += [word[:2], word[2:]]
        else:
            out.append(word)
    return " ".join(out)


def groups(digits: str, rng: random.Random) -> list[str]:
    if len(digits) == 15:
        return [digits[:4], digits[4:10], digits[10:]]
    if len(digits) == 9 and rng.random() < 0.5:
        return [digits[:3], digits[3:5], digits[5:]]
    size = rng.choice([3, 4, 4])
    return [digits[i:i + size] for i in range(0, len(digits), size)]


def chunked(digits: str, rng: random.Random, max_chunks: int = 5) -> list[str]:
    """The digits split in 1-5 chunks, each said its own way."""
    parts = groups(digits, rng)
    n = rng.randint(1, min(max_chunks, len(parts)))
    cuts = sorted(rng.sample(range(1, len(parts)), n - 1)) if n > 1 else []
    bounds = [0, *cuts, len(parts)]
    chunks = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        style = rng.choice(["numerals", "words", "mixed", "pairs", "words"])
        said = ", ".join(say_digits(g, rng, style) for g in parts[a:b])
        chunks.append(damage(said, rng) if rng.random() < 0.5 else said)
    return chunks


ASKS = {
    "PAN": ["Can I get the card number please?", "What's the long number on the front of the card?",
            "And which card will you be using? I'll need the number.", "Go ahead with the card number when ready.",
            "Could you read me the sixteen digits on your visa?"],
    "CVV": ["And the three digit security code on the back?", "What's the CVV?", "And the code on the back of the card?",
            "Lastly the security code please.", "Can you read me the verification code?"],
    "EXPIRY": ["And the expiration date?", "When does the card expire?", "What's the expiry on that card?",
               "And the valid thru date?"],
    "SSN": ["Can I have your social security number?", "I'll need your SSN to verify.",
            "What's your social?", "Could you give me the last four of your social?"],
    "DOB": ["Can you confirm your date of birth?", "What's your birthday?", "And when were you born?",
            "Date of birth please."],
    "ADDRESS": ["What's the address on the account?", "Where should we send it? What's your address?",
                "Can you confirm your mailing address?", "And the billing address please?",
                "What's the zip code?"],
    "ACCOUNT": ["What's your bank account number?", "Can I have the checking account number?",
                "And the account number for the savings?"],
    "ROUTING": ["And the routing number?", "What's the routing number on the check?", "And the bank's ABA number?"],
    "IBAN": ["Can you read me your IBAN?", "What's the IBAN for the transfer?"],
    "PIN": ["What's your PIN?", "Can you give me the four digit pin on the account?", "And the passcode?"],
    "PASSWORD": ["What's the security password on the account?", "Can you tell me your password?",
                 "What's the answer to your security question?", "And your mother's maiden name?"],
    "EMAIL": ["What's your email address?", "Can I get an email for the receipt?"],
    "PHONE": ["What's the best phone number to reach you?", "Can I have a callback number?",
              "What's your mobile number?"],
}
INTROS = ["", "sure, ", "yes it's ", "okay, ", "um, ", "it's ", "yeah so ", "sure it is "]
STREETS = ["Kingsgate", "Maple", "Oak", "Larkspur", "Quarry", "Wexford", "Birchwood", "Sandpiper", "Old Mill",
           "Harbor View", "Tamarack", "Elm", "Fox Hollow", "Cedar", "Juniper", "Sycamore", "Bluebonnet"]
STREET_TYPES = ["street", "avenue", "road", "lane", "drive", "boulevard", "court", "way", "place", "terrace",
                "ridge", "knoll", "esplanade", "glen", "crossing", "hollow", "spur", "bend", "row", "parkway"]
PASSWORDS = ["bluebird", "sunflower seventy", "purple monkey", "grandma rose", "thunder cat", "silver lake",
             "winter garden", "Henderson", "McAllister", "Rosalind"]
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
            "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
            "eighteenth", "nineteenth", "twentieth", "twenty first", "twenty second", "twenty third",
            "twenty fourth", "twenty fifth", "twenty sixth", "twenty seventh", "twenty eighth"]


def year_words(year: int) -> str:
    if 2000 <= year < 2010:
        return "two thousand" + ("" if year == 2000 else " and " + DIGIT_WORDS[year - 2000])
    return f"{two_digit_words(year // 100)} {two_digit_words(year % 100) if year % 100 >= 10 else 'oh ' + DIGIT_WORDS[year % 10]}"


def value_chunks(kind: str, rng: random.Random) -> tuple[list[str], set[str]]:
    """What the caller says for ``kind``, in chunks, and the non-number words that would give it away."""
    if kind == "PAN":
        return chunked(card_number(rng), rng), set()
    if kind == "CVV":
        code = "".join(rng.choice("0123456789") for _ in range(rng.choice([3, 3, 4])))
        return [say_digits(code, rng, rng.choice(["numerals", "words", "mixed"]))], set()
    if kind == "EXPIRY":
        month, year = rng.randint(1, 12), rng.randint(25, 33)
        forms = [f"{month:02d}/{year}", f"{say_digits(f'{month:02d}', rng, 'words')} {two_digit_words(year)}",
                 f"{MONTHS[month - 1]} {year_words(2000 + year)}", f"{MONTHS[month - 1]} {two_digit_words(year)}",
                 f"{month:02d} {year}", f"{two_digit_words(month)} {two_digit_words(year)}"]
        return [rng.choice(forms)], set()
    if kind in ("SSN", "SSN_LAST4"):
        number = ssn(rng)
        if kind == "SSN_LAST4":
            return [say_digits(number[5:], rng, rng.choice(["numerals", "words", "pairs"]))], set()
        return chunked(number, rng, 3), set()
    if kind == "DOB":
        year, month, day = rng.randint(1940, 2005), rng.randint(1, 12), rng.randint(1, 28)
        forms = [f"the {ORDINALS[day - 1]} of {MONTHS[month - 1]} {year_words(year)}",
                 f"{MONTHS[month - 1]} {ORDINALS[day - 1]} {year_words(year)}",
                 f"{month}/{day}/{year}", f"{MONTHS[month - 1]} {day} {year}",
                 f"{say_digits(f'{month:02d}', rng, 'words')} {say_digits(f'{day:02d}', rng, 'words')} {year_words(year)}"]
        return [rng.choice(forms)], set()
    if kind == "ADDRESS":
        street, kind_word = rng.choice(STREETS), rng.choice(STREET_TYPES)
        house = str(rng.randint(2, 99999))
        said_house = say_digits(house, rng, rng.choice(["numerals", "words", "pairs"]))
        zip_code = "".join(rng.choice("0123456789") for _ in range(5))
        forms = [f"{said_house} {street} {kind_word}", f"{said_house} {street} {kind_word} apartment {rng.randint(1, 40)}",
                 f"P O Box {rng.randint(10, 9999)}", f"PO box {say_digits(str(rng.randint(10, 999)), rng, 'words')}",
                 f"{said_house} {street} {kind_word}, zip {say_digits(zip_code, rng, 'words')}"]
        form = rng.choice(forms)
        return [form], {w.lower() for w in street.split()}
    if kind == "ACCOUNT":
        number = "".join(rng.choice("0123456789") for _ in range(rng.randint(8, 12)))
        return chunked(number, rng, 3), set()
    if kind == "ROUTING":
        return chunked(routing_number(rng), rng, 3), set()
    if kind == "IBAN":
        digits = "".join(rng.choice("0123456789") for _ in range(18))
        written = f"GB{digits[:2]} WEST {digits[2:6]} {digits[6:10]} {digits[10:14]} {digits[14:]}"
        return [written], set()
    if kind == "PIN":
        pin = "".join(rng.choice("0123456789") for _ in range(rng.choice([4, 4, 6])))
        return [say_digits(pin, rng, rng.choice(["numerals", "words", "mixed", "pairs"]))], set()
    if kind == "PASSWORD":
        password = rng.choice(PASSWORDS)
        return [password], {w.lower() for w in password.split() if w not in NUMBER_WORDS}
    if kind == "EMAIL":
        name = rng.choice(["john", "maria", "k", "dave", "li"]) + rng.choice(["", " dot smith", " underscore lee", "42"])
        domain = rng.choice(["gmail dot com", "yahoo dot com", "outlook dot com", "example dot org"])
        words = {w for w in name.split() if w not in ("dot", "underscore")}
        return [f"{name} at {domain}"], {w for w in words if not w.isdigit()} | {domain.split()[0]}
    if kind == "PHONE":
        number = rng.choice("23456789") + "".join(rng.choice("0123456789") for _ in range(2)) + \
            rng.choice("23456789") + "".join(rng.choice("0123456789") for _ in range(6))
        return chunked(number, rng, 3), set()
    raise ValueError(kind)


def sensitive_dialogue(kind: str, rng: random.Random) -> Dialogue:
    turns: list[tuple[str, str]] = []
    if rng.random() < 0.5:
        turns.append(("agent", "Thank you for calling, how can I help you today?"))
        turns.append(("customer", "Hi, I'd like to make a payment on my account."))
    if kind in ("CVV", "EXPIRY"):  # asked after the card number, as agents do
        turns.append(("agent", rng.choice(ASKS["PAN"])))
        for chunk in chunked(card_number(rng), rng):
            turns.append(("customer", chunk))
            turns.append(("agent", rng.choice(BACKCHANNELS)))
        if rng.random() < 0.5:
            turns.append(("agent", "Thank you. And the name on the card is the same as the account?"))
            turns.append(("customer", "yes it is"))
    ask_kind = "SSN" if kind == "SSN_LAST4" else kind
    asks = ASKS[ask_kind] if kind != "SSN_LAST4" else ["Could you give me the last four of your social?",
                                                       "Just the last four digits of your SSN please."]
    turns.append(("agent", rng.choice(asks)))
    for _ in range(rng.randint(0, 6) if rng.random() < 0.4 else 0):
        turns.append(rng.choice(DIGRESSIONS))
    chunks, words = value_chunks(kind, rng)
    secret: set[int] = set()
    for i, chunk in enumerate(chunks):
        intro = rng.choice(INTROS) if i == 0 else ""
        if i == 0 and rng.random() < 0.1 and kind not in ("PASSWORD", "EMAIL", "ADDRESS"):
            intro = f"{say_digits(str(rng.randint(1000, 9999)), rng, 'words')}, no wait, sorry, it's "
        secret.add(len(turns))
        turns.append(("customer", intro + chunk))
        if i < len(chunks) - 1:
            turns.append((rng.choice(["agent", "agent", "customer"]), rng.choice(BACKCHANNELS)))
    if rng.random() < 0.4:
        secret.add(len(turns))
        turns.append(("agent", "Let me read that back: " + " ".join(chunks) + ". Is that right?"))
        turns.append(("customer", "yes that's right"))
    turns.append(("agent", rng.choice(CLOSINGS)))
    return Dialogue(kind, turns, secret, words)


NEGATIVES = [
    ("agent", "Your balance is {amount} dollars."), ("customer", "I paid ${dollars}.{cents} last week."),
    ("agent", "That will be {amount} dollars and {cents2} cents."), ("agent", "The price went up to ${dollars}."),
    ("agent", "Your appointment is on {month} {ordinal} at {hour} pm."), ("customer", "Can we do {hour} thirty instead?"),
    ("agent", "The payment is due on the {ordinal} of {month}."), ("agent", "It takes {small} to {small2} business days."),
    ("customer", "I've been waiting {small} weeks."), ("customer", "I have {small} kids on the plan."),
    ("agent", "Please press {digit} for billing."), ("agent", "Choose option {digit} from the menu."),
    ("customer", "My order number is {order}."), ("customer", "The claim number is {claim}."),
    ("agent", "Your policy number is {policy}."), ("customer", "We need {small} more licences."),
    ("customer", "I called about {small} times."), ("agent", "Give it {small} minutes and restart."),
    ("customer", "I ordered {small} items back in {year}."), ("agent", "The confirmation number is {order}."),
    ("customer", "My reference number is {claim}."), ("agent", "We open at {hour} am tomorrow."),
    ("customer", "It was about {amount} bucks."), ("agent", "That's {percent} percent off."),
    ("customer", "The ticket number was {order}."), ("agent", "You'll get {small} emails about it."),
]


def negative_dialogue(rng: random.Random) -> Dialogue:
    """Turns that hold numbers QA must read: amounts, times, dates, durations, counts, menus, order numbers."""
    values = {
        "amount": rng.choice([str(rng.randint(5, 900)), two_digit_words(rng.randint(10, 99))]),
        "dollars": str(rng.randint(5, 900)), "cents": f"{rng.randint(0, 99):02d}",
        "cents2": two_digit_words(rng.randint(1, 99)), "month": rng.choice(MONTHS),
        "ordinal": rng.choice(ORDINALS), "hour": rng.choice([str(rng.randint(1, 12)), DIGIT_WORDS[rng.randint(1, 9)]]),
        "small": rng.choice([str(rng.randint(2, 9)), DIGIT_WORDS[rng.randint(2, 9)]]),
        "small2": str(rng.randint(5, 10)), "digit": rng.choice([str(rng.randint(1, 9)), DIGIT_WORDS[rng.randint(1, 9)]]),
        "order": rng.choice([str(rng.randint(10_000, 99_999_999)), say_digits(str(rng.randint(10_000, 999_999)), rng, "words")]),
        "claim": str(rng.randint(100_000, 9_999_999)), "policy": f"HM{rng.randint(100_000, 999_999)}",
        "year": str(rng.randint(2015, 2025)), "percent": str(rng.choice([10, 15, 20, 25, 30])),
    }
    turns: list[tuple[str, str]] = []
    if rng.random() < 0.5:  # after an exchange that ended
        turns += [("agent", "And the expiration date?"), ("customer", "oh four twenty seven"),
                  ("agent", rng.choice(CLOSINGS))]
    first = len(turns)
    for leg, template in rng.sample(NEGATIVES, rng.randint(1, 3)):
        turns.append((leg, template.format(**values)))
    return Dialogue("NEGATIVE", turns, set(range(first, len(turns))), negative=True)


KINDS = ["PAN", "CVV", "EXPIRY", "SSN", "SSN_LAST4", "DOB", "ADDRESS", "ACCOUNT", "ROUTING", "IBAN", "PIN",
         "PASSWORD", "EMAIL", "PHONE"]


def generate(count_per_kind: int, negatives: int, seed: int = 7) -> list[Dialogue]:
    rng = random.Random(seed)
    out = [sensitive_dialogue(kind, rng) for kind in KINDS for _ in range(count_per_kind)]
    return out + [negative_dialogue(rng) for _ in range(negatives)]


def timed(turns: list[tuple[str, str]]) -> list[tuple[str, str, int, int]]:
    """Turns with call times: about 0.3 s a word and half a second between turns."""
    out, t = [], 0
    for leg, text in turns:
        duration = 600 + 300 * len(text.split())
        out.append((leg, text, t, t + duration))
        t += duration + 500
    return out


def leaked(dialogue: Dialogue, redacted: list[str]) -> list[str]:
    """What of the value is still readable in the turns that held it: digits, number words, its words."""
    found = []
    for i in dialogue.secret_turns:
        text = redacted[i].lower()
        words = [w.strip(".,?!:;'\"") for w in text.replace("-", " ").replace("/", " ").split()]
        for word in words:
            # "for" and "to" appear in no frame of a turn that holds a value: there they are damaged digits.
            if any(ch.isdigit() for ch in word) or word in NUMBER_WORDS or word in dialogue.secret_words \
                    or word in ("for", "to"):
                found.append(word)
    return found
