"""Labelled System One requests: a generated evaluation set with known answers, and a user's labelled file.

:func:`generate` writes support tickets, product reviews, emails (with
phishing cues) and order records (JSON) from rules: a few latent facts are
drawn first (a ticket's product area, a review's stars, an email's category
and cues...), the text is assembled from phrase banks that state those facts,
and each question's gold answer is read off the facts, so no model has seen
the data and the answers are known. Every question type is there, 2 to 12
options, text and JSON states. The yes/no cue questions are mostly "no" (as in
issue 14's held-out set, where our nouls answered "yes"); seven more are
mostly "yes" (issue 23: a business still running, a product kept, more than one
star, a genuine email, an order paid, on time, a customer staying), read off
facts already drawn, so the states and the other answers are those of the set
before them. A quarter of each group goes against its majority.

A labelled file is JSON lines, one request each::

    {"id": "t1", "request": {<a /v1/systemone body>}, "gold": {"<question id>": <answer>, ...}}

with a noul's answer ``true`` / ``false`` (or ``"yes"`` / ``"no"``), a
choice's the label, a score's the level number (0 first). ``id`` is
optional; questions without a gold answer are asked and not scored.
:func:`read_jsonl` reads one (validating each request as the server does),
:func:`write_jsonl` writes one, the generated set included.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from gateway.decision import schema

#: The generator's default seed and size (states per domain: tickets, reviews, emails, orders).
SEED = 14
SIZES = {"ticket": 16, "review": 16, "email": 20, "order": 12}


@attrs.frozen
class Labelled:
    """One labelled request.

    ``id``: a name for it; ``body``: the ``/v1/systemone`` body (a dict, as
    sent); ``gold``: question id -> the gold option's index in reply order
    (noul: 1 yes, 0 no; choice: the label's index in ``criteria`` as sent;
    score: the level); ``tasks``: question id -> a task name that groups the
    same question across requests (the generator's, or the question id in a
    user's file).
    """

    id: str
    body: dict[str, Any]
    gold: dict[str, int]
    tasks: dict[str, str]


class LabelledFileError(ValueError):
    """A labelled file that cannot be read: the message names the line and the field."""


# --- reading and writing --------------------------------------------------------------------------


def gold_index(question: schema.Question, answer: Any) -> int:
    """The reply-order index of ``answer`` for ``question`` (see the module doc for the forms).

    Raises ``ValueError`` naming what was expected.
    """
    if question.type == "noul":
        if answer is True or answer in ("yes", "true"):
            return 1
        if answer is False or answer in ("no", "false"):
            return 0
        raise ValueError(f"a noul's answer is true or false (or 'yes' / 'no'), got {answer!r}")
    if question.type == "choice":
        labels = list(question.criteria)
        if not isinstance(answer, str) or answer not in labels:
            raise ValueError(f"a choice's answer is one of its labels {labels!r}, got {answer!r}")
        return labels.index(answer)
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(question.criteria):
        raise ValueError(f"a score's answer is a level 0..{len(question.criteria) - 1}, got {answer!r}")
    return answer


def gold_value(question: schema.Question, index: int) -> Any:
    """The inverse of :func:`gold_index`: ``True``/``False``, the label, or the level."""
    if question.type == "noul":
        return index == 1
    if question.type == "choice":
        return list(question.criteria)[index]
    return index


def parse_line(obj: Any, where: str) -> Labelled:
    """One labelled record (a decoded JSON line). Raises :class:`LabelledFileError` naming ``where`` and the field."""
    if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict) or not isinstance(obj.get("gold"), dict):
        raise LabelledFileError(
            f"{where}: expected an object with 'request' (a System One body) and 'gold' (an object)"
        )
    try:
        parsed = schema.parse_request(obj["request"])
    except schema.JevValidationError as exc:
        raise LabelledFileError(f"{where}: request: {exc}") from None
    by_id = {q.id: q for q in parsed.questions}
    gold = {}
    for qid, answer in obj["gold"].items():
        if qid not in by_id:
            raise LabelledFileError(f"{where}: gold.{qid}: no question {qid!r} in the request")
        try:
            gold[qid] = gold_index(by_id[qid], answer)
        except ValueError as exc:
            raise LabelledFileError(f"{where}: gold.{qid}: {exc}") from None
    rid = obj.get("id", where)
    tasks = obj.get("tasks")
    if not isinstance(tasks, dict):
        tasks = {}
    return Labelled(str(rid), obj["request"], gold, {qid: str(tasks.get(qid, qid)) for qid in by_id})


def read_jsonl(path: str | Path) -> list[Labelled]:
    """Every record of a labelled JSONL file (blank lines skipped).

    Raises :class:`LabelledFileError` (``path:line: ...``) for a line that
    is not JSON, a request that does not validate, or a gold answer that is
    not one of its question's options; ``OSError`` when the file cannot be read.
    """
    return [parse_line(obj, where) for where, obj in json_lines(path, LabelledFileError)]


def json_lines(path: str | Path, error: type[Exception]) -> Iterator[tuple[str, Any]]:
    """``(where, decoded line)`` for each non-blank line of a JSONL file, ``where`` being ``path:line``.

    Raises ``error("path:line: not JSON: ...")`` for a line that is not JSON, ``OSError`` as reading does.
    """
    with open(path, "rb") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield where, orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise error(f"{where}: not JSON: {exc}") from None


def to_json(item: Labelled) -> dict[str, Any]:
    """The JSON line of ``item`` (:func:`read_jsonl`'s form, with ``tasks`` kept)."""
    parsed = schema.parse_request(item.body)
    by_id = {q.id: q for q in parsed.questions}
    return {
        "id": item.id,
        "request": item.body,
        "gold": {qid: gold_value(by_id[qid], g) for qid, g in item.gold.items()},
        "tasks": item.tasks,
    }


def write_jsonl(items: Iterable[Labelled], path: str | Path) -> None:
    """Write ``items`` as a labelled JSONL file that :func:`read_jsonl` reads back equal."""
    with open(path, "wb") as f:
        for item in items:
            f.write(orjson.dumps(to_json(item)) + b"\n")


# --- the generator ---------------------------------------------------------------------------------

NAMES = [
    "Anna",
    "Ben",
    "Chloe",
    "David",
    "Elena",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kemal",
    "Lucia",
    "Marta",
    "Noah",
    "Olga",
    "Pablo",
    "Rosa",
    "Sven",
    "Tara",
    "Umar",
]

DEPARTMENTS = {
    "billing": "payments, charges, invoices",
    "technical": "bugs, errors, crashes, integrations",
    "sales": "prices, quotes, plan upgrades",
    "account": "logins, passwords, user access",
}

#: Ticket product areas: area -> (department, sentences stating a problem in that area).
AREAS = {
    "payments": (
        "billing",
        [
            "I was charged twice for my subscription this month.",
            "My card was charged but the payment shows as failed.",
            "The amount taken from my card is higher than my plan's price.",
        ],
    ),
    "invoices": (
        "billing",
        [
            "I need a copy of last month's invoice for our accountant.",
            "The invoice lists the wrong company address.",
            "Our VAT number is missing from the invoices.",
        ],
    ),
    "pricing": (
        "sales",
        [
            "Do you offer a discount if we pay for a whole year?",
            "What would the enterprise plan cost for 40 seats?",
            "Can you send me a quote for the business plan?",
        ],
    ),
    "upgrades": (
        "sales",
        [
            "We would like to move from the starter plan to the team plan.",
            "Can we add 20 more seats to our current plan?",
            "What do we gain by upgrading to the premium tier?",
        ],
    ),
    "login": (
        "account",
        [
            "I cannot log in: it says my password is wrong although I just reset it.",
            "The password reset email never arrives.",
            "My two-factor codes are rejected every time I sign in.",
        ],
    ),
    "permissions": (
        "account",
        [
            "My colleague cannot see the projects I shared with her.",
            "How do I make another user an administrator?",
            "I need to remove a former employee's access to our workspace.",
        ],
    ),
    "api": (
        "technical",
        [
            "Your API returns a 500 error on every file upload.",
            "API requests time out after 30 seconds since yesterday.",
            "The webhook payload is missing the order id field.",
        ],
    ),
    "mobile app": (
        "technical",
        [
            "The mobile app crashes as soon as I open the settings page.",
            "The iPhone app logs me out every hour.",
            "The Android app shows a blank screen after the update.",
        ],
    ),
    "export": (
        "technical",
        [
            "Exporting a report to CSV gives an empty file.",
            "The PDF export cuts off the last page of every report.",
            "Excel exports show all dates as numbers.",
        ],
    ),
    "integrations": (
        "technical",
        [
            "The Stripe integration keeps failing to connect.",
            "The Slack integration stopped posting messages to our channel.",
            "Our Salesforce sync has not run for three days.",
        ],
    ),
    "notifications": (
        "technical",
        [
            "I no longer receive any email notifications.",
            "Every notification arrives twice.",
            "Push notifications show up hours late.",
        ],
    ),
    "performance": (
        "technical",
        [
            "The dashboard now takes over a minute to load.",
            "Search has become very slow since Monday.",
            "Saving a document takes twenty seconds.",
        ],
    ),
}

SEVERITY_LEVELS = [
    "no impact on work",
    "a minor inconvenience",
    "blocks part of the work",
    "the whole business is stopped",
]
SEVERITY_SENTENCES = [
    [
        "No rush, this is not affecting our work.",
        "It is not urgent, just something I noticed.",
        "Whenever you have time; nothing depends on it.",
    ],
    [
        "It is a bit annoying but we can work around it.",
        "It slows me down a little.",
        "A small nuisance, we manage for now.",
    ],
    [
        "Part of my team cannot do their work until this is fixed.",
        "I am blocked on one of my tasks because of this.",
        "Two of our staff are stuck and waiting.",
    ],
    [
        "Our whole business is stopped and we are losing customers.",
        "Nothing works for us: all our sales have stopped.",
        "We are completely down and losing money every hour.",
    ],
]
REFUND_SENTENCES = [
    "Please refund the money.",
    "I want a refund for this month.",
    "I expect my money back for this.",
    "Please give me a refund.",
]
COMPETITORS = ["Zendesk", "Freshdesk", "HubSpot", "Intercom"]
COMPETITOR_SENTENCES = [
    "We are seriously considering moving to {}.",
    "{} offered us a better deal.",
    "A colleague says {} does this without problems.",
]
GREETINGS = ["Hi,", "Hello,", "Dear support,", "Hi team,", ""]
CLOSINGS = ["Thanks, {}", "Regards, {}", "{}", "Best, {}"]

REVIEW_STARS = ["1 star: terrible", "2 stars: poor", "3 stars: average", "4 stars: good", "5 stars: excellent"]
ASPECTS = {
    "price": "cost, value for money",
    "quality": "materials, build, durability",
    "shipping": "delivery time, packaging",
    "customer service": "support staff, replies",
    "size": "fit, dimensions",
    "battery": "battery life, charging",
}
#: (aspect, polarity) -> sentences; polarity 0 negative, 1 mixed, 2 positive.
ASPECT_SENTENCES = {
    "price": [
        ["Far too expensive for what you get.", "A waste of money at this price."],
        ["The price is fair, nothing special.", "Not cheap, not expensive either."],
        ["Great value for the money.", "Cheaper than any other brand and just as good."],
    ],
    "quality": [
        ["It broke after two days.", "The plastic feels cheap and cracked already."],
        ["The build is fine but the buttons feel loose.", "Decent materials, a few rough edges."],
        ["Solid build, it feels like it will last for years.", "The materials are excellent."],
    ],
    "shipping": [
        ["It arrived three weeks late in a crushed box.", "The parcel came damaged and late."],
        ["Delivery took a week, as announced.", "The box was a bit dented but the item was fine."],
        ["It arrived the next day, perfectly packed.", "Super fast delivery and careful packaging."],
    ],
    "customer service": [
        ["Support never answered my emails.", "The staff were rude when I called."],
        ["Support answered after a few days.", "The agent was polite but could not really help."],
        ["The support team solved my problem in minutes.", "Friendly staff who replied the same day."],
    ],
    "size": [
        ["Much smaller than the picture suggests; it does not fit.", "Two sizes too small."],
        ["The size runs a little large.", "It fits, although the sleeves are long."],
        ["It fits perfectly.", "Exactly the size described."],
    ],
    "battery": [
        ["The battery dies after an hour.", "It will not hold a charge at all."],
        ["The battery lasts most of a day.", "Charging is slow but the battery is okay."],
        ["The battery lasts a whole week.", "It charges in twenty minutes and lasts for days."],
    ],
}
STAR_SENTENCES = [
    ["Terrible, avoid it.", "The worst purchase I have made."],
    ["Pretty disappointing overall.", "I expected much more."],
    ["It is okay, it does the job.", "Average, neither good nor bad."],
    ["Good product, I am happy with it.", "Nice, I would buy it again."],
    ["Absolutely excellent, I love it!", "Perfect in every way."],
]
RETURN_SENTENCES = ["I am sending it back.", "I returned it for a refund.", "It is going back to the shop tomorrow."]
PRODUCTS = [
    "wireless headphones",
    "running shoes",
    "a rain jacket",
    "a blender",
    "a smart watch",
    "a desk lamp",
    "a phone case",
    "a backpack",
]

EMAIL_CATEGORIES = {
    "phishing": "an attempt to steal data or money",
    "invoice": "a bill or a payment request",
    "newsletter": "news or marketing sent to many people",
    "meeting": "arranging a meeting or a call",
    "personal": "a message from a friend or a relative",
}
EMAIL_RISK = ["safe", "suspicious", "dangerous"]
EMAIL_BODIES = {
    "phishing": [
        "We detected unusual activity on your bank account.",
        "Your mailbox is full and will stop working.",
        "You have won a gift card worth 500 euros.",
        "Your parcel could not be delivered.",
    ],
    "invoice": [
        "Please find our invoice 4471 for October attached.",
        "Your invoice for the November hosting is ready.",
        "This is the bill for the repairs done last week.",
    ],
    "newsletter": [
        "This month in our newsletter: three new features and a webinar.",
        "Our autumn collection is here, with 20% off for subscribers.",
        "Read the five most popular articles of the week.",
    ],
    "meeting": [
        "Could we meet on Thursday at 10 to go over the roadmap?",
        "Are you free for a short call tomorrow afternoon?",
        "I would like to move our weekly meeting to Friday.",
    ],
    "personal": [
        "The kids had a great time at grandma's this weekend.",
        "Happy birthday! I hope you have a lovely day.",
        "We finally got the new sofa, come and see it.",
    ],
}
CREDENTIAL_SENTENCES = [
    "Reply with your username and password to keep your account.",
    "Confirm your login details and your PIN on the form.",
    "Enter your password on our secure page to verify your identity.",
]
LINK_SENTENCES = {
    "phishing": [
        "Verify here: http://secure-login.account-check.net/verify",
        "Click http://bit.ly/claim-now to continue.",
    ],
    "other": ["The details are at https://docs.example.com/agenda.", "See https://www.example.org/news for more."],
}
PRESSURE_SENTENCES = {
    "phishing": [
        "You must do this within 24 hours or your account will be deleted.",
        "Act now: this is your last warning.",
    ],
    "invoice": ["Payment is due today; pay immediately to avoid a late fee."],
    "other": ["Please answer right away, it cannot wait."],
}
SENDERS = {
    "phishing": ["security@acc0unt-verify.net", "no-reply@prize-center.biz", "support@bank-secure-mail.com"],
    "invoice": ["billing@hostingcompany.com", "accounts@garage-weber.de"],
    "newsletter": ["news@shop.example.com", "hello@weekly-digest.com"],
    "meeting": ["{}@ourcompany.com"],
    "personal": ["{}.family@mail.com"],
}
SUBJECTS = {
    "phishing": ["Urgent: account notice", "You are a winner", "Delivery problem"],
    "invoice": ["Invoice 4471", "Your monthly bill"],
    "newsletter": ["News for you", "This week"],
    "meeting": ["Meeting", "Quick call?"],
    "personal": ["Hello!", "Weekend"],
}

ORDER_STATUSES = {
    "pending": "not paid yet",
    "paid": "paid, not packed",
    "packed": "packed, waiting for the carrier",
    "shipped": "with the carrier",
    "delivered": "received by the customer",
    "cancelled": "cancelled before shipping",
    "returned": "sent back by the customer",
    "lost": "lost by the carrier",
}
ORDER_EVENTS = {
    "pending": "order placed, waiting for payment",
    "paid": "payment received",
    "packed": "parcel packed at the warehouse",
    "shipped": "handed to the carrier",
    "delivered": "delivered to the customer",
    "cancelled": "order cancelled by the customer",
    "returned": "return received at the warehouse",
    "lost": "carrier reported the parcel as lost",
}
ORDER_NOTES_URGENT = [
    "I need this for my wedding on Saturday, please hurry!",
    "Needed for a trip tomorrow morning.",
    "Our shop runs out of stock on Monday, we need it before.",
]
ORDER_NOTES_CALM = ["No hurry.", "Leave it with the neighbour if I am out.", "", "Please use recycled packaging."]
ORDER_GIFT_NOTES = ["It is a present for my mother.", "This is a gift, please do not include the price."]


def _question_sets() -> dict[str, dict[str, dict[str, Any]]]:
    """The questions of each domain, by question id (each id is its own task)."""
    return {
        "ticket": {
            "department": {
                "type": "choice",
                "instructions": "Which team should handle this ticket?",
                "criteria": dict(DEPARTMENTS),
            },
            "area": {
                "type": "choice",
                "instructions": "Which part of the product is the ticket about?",
                "criteria": {a: None for a in AREAS},
            },
            "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
            "severity": {
                "type": "score",
                "instructions": "How badly is the customer's work affected?",
                "criteria": list(SEVERITY_LEVELS),
            },
            "competitor": {"type": "noul", "instructions": "Does the customer mention a competitor?"},
            "running": {"type": "noul", "instructions": "Is the customer's business still running?"},
            "staying": {"type": "noul", "instructions": "Does the customer intend to stay with us?"},
        },
        "review": {
            "sentiment": {
                "type": "choice",
                "instructions": "Is this review positive or negative?",
                "criteria": {"positive": None, "negative": None},
            },
            "stars": {
                "type": "score",
                "instructions": "How many stars did the reviewer give?",
                "criteria": list(REVIEW_STARS),
            },
            "aspect": {
                "type": "choice",
                "instructions": "Which aspect of the product does the review talk about most?",
                "criteria": dict(ASPECTS),
            },
            "returned": {
                "type": "noul",
                "instructions": "Does the reviewer say they returned or will return the product?",
            },
            "kept": {"type": "noul", "instructions": "Does the reviewer keep the product?"},
            "above_one_star": {"type": "noul", "instructions": "Did the reviewer give more than one star?"},
        },
        "email": {
            "credentials": {"type": "noul", "instructions": "Does the sender ask for a password or login details?"},
            "link": {"type": "noul", "instructions": "Does the email contain a web link?"},
            "pressure": {"type": "noul", "instructions": "Does the sender pressure the reader to act immediately?"},
            "category": {
                "type": "choice",
                "instructions": "What kind of email is this?",
                "criteria": dict(EMAIL_CATEGORIES),
            },
            "risk": {
                "type": "score",
                "instructions": "How risky is it to follow this email?",
                "criteria": list(EMAIL_RISK),
            },
            "genuine": {"type": "noul", "instructions": "Is this a genuine email rather than a scam?"},
        },
        "order": {
            "status": {
                "type": "choice",
                "instructions": "What is the order's current status?",
                "criteria": dict(ORDER_STATUSES),
            },
            "late": {"type": "noul", "instructions": "Is the order late?"},
            "gift": {"type": "noul", "instructions": "Is the order a gift?"},
            "paid": {"type": "noul", "instructions": "Has the order been paid for?"},
            "on_time": {"type": "noul", "instructions": "Is the order on time?"},
            "priority": {
                "type": "score",
                "instructions": "How urgently does the customer need the order?",
                "criteria": ["normal", "urgent"],
            },
        },
    }


def _ticket(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    dept = rng.choice(list(DEPARTMENTS))
    area = rng.choice([a for a, (d, _) in AREAS.items() if d == dept])
    severity = rng.randrange(4)
    refund = rng.random() < 0.25
    competitor = rng.random() < 0.2
    name = rng.choice(NAMES)
    body = [rng.choice(AREAS[area][1]), rng.choice(SEVERITY_SENTENCES[severity])]
    if refund:
        body.append(rng.choice(REFUND_SENTENCES))
    if competitor:
        body.insert(rng.randrange(1, len(body) + 1), rng.choice(COMPETITOR_SENTENCES).format(rng.choice(COMPETITORS)))
    greeting = rng.choice(GREETINGS)
    text = " ".join(([greeting] if greeting else []) + body + [rng.choice(CLOSINGS).format(name)])
    if rng.random() < 1 / 3:
        state: Any = {
            "channel": rng.choice(["email", "chat", "web form"]),
            "customer": name,
            "plan": rng.choice(["starter", "team", "business"]),
            "message": " ".join(body),
        }
    else:
        state = text
    gold = {
        "department": dept,
        "area": area,
        "refund": refund,
        "severity": severity,
        "competitor": competitor,
        "running": severity < 3,
        "staying": not competitor,
    }
    return state, gold


def _review(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    stars = rng.randrange(5)
    aspect = rng.choice(list(ASPECTS))
    polarity = 0 if stars <= 1 else 1 if stars == 2 else 2
    returned = rng.random() < (0.45 if stars <= 1 else 0.1)
    body = [rng.choice(ASPECT_SENTENCES[aspect][polarity]), rng.choice(STAR_SENTENCES[stars])]
    rng.shuffle(body)
    product = rng.choice(PRODUCTS)
    body.insert(0, f"I bought {product}.")
    if returned:
        body.append(rng.choice(RETURN_SENTENCES))
    text = " ".join(body)
    state: Any = {"product": product, "review": " ".join(body[1:])} if rng.random() < 0.25 else text
    gold = {
        "sentiment": "positive" if stars >= 2 else "negative",
        "stars": stars,
        "aspect": aspect,
        "returned": returned,
        "kept": not returned,
        "above_one_star": stars >= 1,
    }
    return state, gold


def _email(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    cat = rng.choices(list(EMAIL_CATEGORIES), weights=[3, 2, 2, 2, 2])[0]  # phishing a little more often
    phishing = cat == "phishing"
    credentials = phishing and rng.random() < 0.6
    link = rng.random() < {"phishing": 0.8, "newsletter": 0.7, "invoice": 0.3, "meeting": 0.2, "personal": 0.1}[cat]
    pressure = rng.random() < {"phishing": 0.6, "invoice": 0.25}.get(cat, 0.05)
    body = [rng.choice(EMAIL_BODIES[cat])]
    if credentials:
        body.append(rng.choice(CREDENTIAL_SENTENCES))
    if link:
        body.append(rng.choice(LINK_SENTENCES["phishing" if phishing else "other"]))
    if pressure:
        body.append(rng.choice(PRESSURE_SENTENCES.get(cat, PRESSURE_SENTENCES["other"])))
    name = rng.choice(NAMES)
    sender = rng.choice(SENDERS[cat]).format(rng.choice(NAMES).lower())
    subject = rng.choice(SUBJECTS[cat])
    text_body = f"Dear {name},\n" + " ".join(body)
    if rng.random() < 0.5:
        state: Any = {"from": sender, "subject": subject, "body": text_body}
    else:
        state = f"From: {sender}\nSubject: {subject}\n\n{text_body}"
    risk = 2 if credentials else 1 if phishing or pressure else 0
    gold = {
        "credentials": credentials,
        "link": link,
        "pressure": pressure,
        "category": cat,
        "risk": risk,
        "genuine": not phishing,
    }
    return state, gold


def _order(rng: random.Random) -> tuple[Any, dict[str, Any]]:
    status = rng.choice(list(ORDER_STATUSES))
    flow = ["pending", "paid", "packed", "shipped", "delivered"]
    if status in flow:
        history = flow[: flow.index(status) + 1]
    elif status == "cancelled":
        history = ["pending", "paid", "cancelled"]
    elif status == "returned":
        history = flow + ["returned"]
    else:
        history = ["pending", "paid", "packed", "shipped", "lost"]
    late = status not in ("cancelled", "returned") and rng.random() < 0.3
    urgent = rng.random() < 0.3
    gift = rng.random() < 0.25
    notes = [rng.choice(ORDER_NOTES_URGENT if urgent else ORDER_NOTES_CALM)]
    if gift:
        notes.append(rng.choice(ORDER_GIFT_NOTES))
    state = {
        "order": f"A{rng.randrange(1000, 9999)}",
        "item": rng.choice(PRODUCTS),
        "history": [ORDER_EVENTS[s] for s in history],
        "days_past_promised_date": rng.randrange(1, 9) if late else 0,
        "customer_note": " ".join(n for n in notes if n),
    }
    gold = {
        "status": status,
        "late": late,
        "gift": gift,
        "priority": 1 if urgent else 0,
        "paid": status != "pending",
        "on_time": not late,
    }
    return state, gold


_DOMAINS = {"ticket": _ticket, "review": _review, "email": _email, "order": _order}


def generate(seed: int = SEED, sizes: dict[str, int] | None = None) -> list[Labelled]:
    """The generated evaluation set: ``sizes[domain]`` requests per domain (default :data:`SIZES`).

    Deterministic for a ``seed`` (Python's ``random.Random``). Each request
    asks every question of its domain (ids and texts in
    :func:`_question_sets`; the task of a question is ``domain.id``) about one
    state; ``id`` is ``domain-k``. Returns the requests domain by domain.
    """
    rng = random.Random(seed)
    sizes = dict(SIZES if sizes is None else sizes)
    qsets = _question_sets()
    out = []
    for domain, make in _DOMAINS.items():
        for k in range(sizes.get(domain, 0)):
            state, answers = make(rng)
            questions = qsets[domain]
            body = {"state": state, "questions": questions}
            parsed = schema.parse_request(body)
            gold = {q.id: gold_index(q, answers[q.id]) for q in parsed.questions}
            out.append(Labelled(f"{domain}-{k}", body, gold, {qid: f"{domain}.{qid}" for qid in questions}))
    return out


def summary(items: Sequence[Labelled]) -> dict[str, dict[str, Any]]:
    """Per task: its type, option count, question count and the share of each gold answer (by index)."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        parsed = schema.parse_request(item.body)
        for q in parsed.questions:
            if q.id not in item.gold:
                continue
            t = out.setdefault(item.tasks[q.id], {"type": q.type, "options": q.n_options, "n": 0, "gold": {}})
            t["n"] += 1
            t["gold"][item.gold[q.id]] = t["gold"].get(item.gold[q.id], 0) + 1
    return out
