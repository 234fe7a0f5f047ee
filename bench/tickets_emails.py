"""A labelled set in the shape of support tickets and e-mails: choice, score and yes/no questions (issue 47).

Each text was written by hand, one by one, and labelled by this written policy (the label is what the
policy says of the text, not what any model answered):

Tickets (``ticket-*``):

- ``queue`` (choice): ``billing`` when the customer writes about a charge, an invoice, a refund, a price or a
  plan; ``technical`` for something of the product that fails (an error, a crash, an integration, an
  outage); ``account`` for logging in, passwords, access and profile details; ``shipping`` for a physical
  delivery (late, lost, damaged parcels, addresses); ``other`` for anything else (praise, a partnership).
  When two apply, the one the customer asks us to act on.
- ``priority`` (score, 0-3): 3 when the customer's business is down or losing money now; 2 when they are
  blocked on one task (cannot do one thing they need); 1 when it is an inconvenience with a way around it
  or no date; 0 for a question or a remark with no impact.
- ``angry`` (noul): yes when the writer states anger, frustration or an ultimatum in words ("unacceptable",
  "furious", "last time", capitals); a polite report of a problem is no.
- ``refund`` (noul, mostly no): yes only when the writer asks for money back.

E-mails (``email-*``):

- ``kind`` (choice): ``phishing`` when the sender impersonates someone to get credentials, money or a click
  (a mismatched sender, a login link, a threat); ``invoice`` for a genuine bill or receipt; ``newsletter``
  for a mailing to many readers; ``work`` for a colleague or business contact's message; ``personal`` for
  friends and family.
- ``urgency`` (score, 0-2): 2 when the e-mail asks for something today or sooner; 1 within days (a date this
  week, "soon"); 0 when nothing is asked by a date.
- ``phishing`` (noul, mostly no): yes exactly when ``kind`` is ``phishing``.
- ``genuine`` (noul, mostly yes): "Is this a genuine e-mail from who it claims to be?": no exactly when
  ``kind`` is ``phishing``.

    .venv/bin/python -m bench.tickets_emails OUT.jsonl      # the labelled file (calibrate --data format)
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

TICKET_QUESTIONS = {
    "queue": {
        "type": "choice",
        "instructions": "Which queue should handle this ticket?",
        "criteria": {
            "billing": "charges, invoices, refunds, plans",
            "technical": "errors, crashes, integrations, outages",
            "account": "login, passwords, access, profile",
            "shipping": "deliveries, parcels, addresses",
            "other": "anything else",
        },
    },
    "priority": {
        "type": "score",
        "instructions": "How urgent is this ticket?",
        "criteria": [
            "low: a question, no impact",
            "normal: an inconvenience",
            "high: blocked on one task",
            "urgent: business down or losing money",
        ],
    },
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
}

EMAIL_QUESTIONS = {
    "kind": {
        "type": "choice",
        "instructions": "What kind of e-mail is this?",
        "criteria": {
            "personal": "from friends or family",
            "work": "from a colleague or business contact",
            "newsletter": "a mailing to many readers",
            "invoice": "a bill or a receipt",
            "phishing": "a scam impersonating someone",
        },
    },
    "urgency": {
        "type": "score",
        "instructions": "How soon does the e-mail ask the reader to act?",
        "criteria": ["no deadline", "within days", "today"],
    },
    "phishing": {"type": "noul", "instructions": "Is this e-mail a phishing attempt?"},
    "genuine": {"type": "noul", "instructions": "Is this a genuine e-mail from who it claims to be?"},
}

#: (text, queue, priority 0-3, angry, refund)
TICKETS = [
    ("I was charged twice for my March invoice. Please refund the duplicate charge.", "billing", 1, False, True),
    (
        "Our checkout page throws a 500 error since this morning and no customer can pay. We are losing orders "
        "every minute!",
        "technical",
        3,
        True,
        False,
    ),
    (
        "I forgot my password and the reset e-mail never arrives. I can't log in to download my report.",
        "account",
        2,
        False,
        False,
    ),
    ("My parcel was supposed to arrive on Monday, the tracking has not moved for a week.", "shipping", 1, False, False),
    ("Just wanted to say your new dashboard is lovely, great work team!", "other", 0, False, False),
    (
        "This is UNACCEPTABLE. Third time the Slack integration drops our messages. Fix it today or we leave.",
        "technical",
        2,
        True,
        False,
    ),
    ("Can I switch from the monthly plan to the yearly one, and what would it cost?", "billing", 0, False, False),
    ("The box arrived crushed and the lamp inside is broken. I want my money back.", "shipping", 1, True, True),
    ("How do I add a second admin to our team account?", "account", 0, False, False),
    (
        "The mobile app crashes when I open the settings screen. I can use the website meanwhile.",
        "technical",
        1,
        False,
        False,
    ),
    (
        "You cancelled my subscription without asking and now our whole shop is offline. I am furious. Restore it now.",
        "billing",
        3,
        True,
        False,
    ),
    ("Please change the delivery address of order 4471 to 12 Rose Lane before it ships.", "shipping", 1, False, False),
    ("We'd like to discuss a partnership for the spring campaign. Who can I talk to?", "other", 0, False, False),
    (
        "I was locked out after two wrong codes and I can't approve payroll, which is due today.",
        "account",
        3,
        False,
        False,
    ),
    ("The export to CSV skips the last column. Annoying, but I can copy it by hand.", "technical", 1, False, False),
    (
        "I've asked three times for the invoice to show our VAT number. Last time I'm asking politely. And refund "
        "the late fee you charged.",
        "billing",
        1,
        True,
        True,
    ),
]

#: (text, kind, urgency 0-2)
EMAILS = [
    (
        "From: security@paypa1-support.com\nSubject: Account suspended\n\nYour account is suspended. Log in within "
        "24 hours at http://paypa1-verify.co to restore access or lose your funds.",
        "phishing",
        2,
    ),
    (
        "From: mum@gmail.com\nSubject: Sunday\n\nLunch at ours on Sunday? Dad's making his lasagne. Love, Mum",
        "personal",
        0,
    ),
    (
        "From: billing@hostingco.com\nSubject: Your receipt for December\n\nThanks for your payment of $12.00. "
        "Receipt #88213 is attached. No action is needed.",
        "invoice",
        0,
    ),
    (
        "From: news@gardenweekly.com\nSubject: 10 bulbs to plant this month\n\nThis week's issue: winter bulbs, "
        "pruning roses and a reader's greenhouse tour. Unsubscribe at the bottom.",
        "newsletter",
        0,
    ),
    (
        "From: anna.k@ourcompany.com\nSubject: Slides for Thursday\n\nHi, could you send me your slides by "
        "Wednesday so I can merge them into the board deck? Thanks, Anna",
        "work",
        1,
    ),
    (
        "From: it-helpdesk@0urcompany-mail.com\nSubject: Password expires today\n\nYour mailbox password expires "
        "today. Confirm your current password here to keep your e-mail: http://bit.ly/3xMail",
        "phishing",
        2,
    ),
    (
        "From: accounts@officesupplies.com\nSubject: Invoice INV-2291 due on Friday\n\nPlease find attached our "
        "invoice for 40 reams of paper, payable by Friday by bank transfer as usual.",
        "invoice",
        1,
    ),
    (
        "From: tom.b@gmail.com\nSubject: photos!\n\nHere are the pictures from the hike, the one at the summit is "
        "my favourite. Tom",
        "personal",
        0,
    ),
    (
        "From: ceo@ourcompany.co\nSubject: Urgent favour\n\nI'm in a meeting and need you to buy five $100 gift "
        "cards right now and send me the codes. Don't tell anyone, I'll explain later.",
        "phishing",
        2,
    ),
    (
        "From: raj@supplierltd.com\nSubject: Delivery slot\n\nThe pallets can come Tuesday or Thursday next week; "
        "which suits your warehouse?",
        "work",
        1,
    ),
    (
        "From: offers@shoeshop.com\nSubject: Winter sale: 30% off\n\nOur winter sale starts now for all members. "
        "Browse the collection online.",
        "newsletter",
        0,
    ),
    (
        "From: dhl-delivery@parcel-notice.info\nSubject: Parcel on hold\n\nYour parcel is held. Pay the 1.99 EUR "
        "customs fee at this link today or it will be returned.",
        "phishing",
        2,
    ),
    (
        "From: lea@ourcompany.com\nSubject: Server is down\n\nThe build server is down and the release is at 5pm "
        "today. Can you restart it as soon as you read this?",
        "work",
        2,
    ),
    (
        "From: sis@yahoo.com\nSubject: Mum's birthday\n\nCan you call me today? We need to book the restaurant for "
        "Mum's birthday before they fill up tonight.",
        "personal",
        2,
    ),
    (
        "From: noreply@cityenergy.com\nSubject: Your bill is ready\n\nYour electricity bill of 64.20 EUR is ready "
        "and will be debited on the 15th. Nothing to do.",
        "invoice",
        0,
    ),
    (
        "From: digest@devnews.io\nSubject: This week in Python\n\nNew releases, a talk on packaging and five "
        "libraries worth a look. Read online.",
        "newsletter",
        0,
    ),
]


def lines() -> list[dict]:
    """The labelled requests (``{"id", "request", "gold"}``), tickets first, then e-mails."""
    out = []
    for i, (text, queue, priority, angry, refund) in enumerate(TICKETS):
        out.append(
            {
                "id": f"ticket-{i}",
                "request": {"state": text, "questions": TICKET_QUESTIONS},
                "gold": {"queue": queue, "priority": priority, "angry": angry, "refund": refund},
            }
        )
    for i, (text, kind, urgency) in enumerate(EMAILS):
        phishing = kind == "phishing"
        out.append(
            {
                "id": f"email-{i}",
                "request": {"state": text, "questions": EMAIL_QUESTIONS},
                "gold": {"kind": kind, "urgency": urgency, "phishing": phishing, "genuine": not phishing},
            }
        )
    return out


def main() -> None:
    Path(sys.argv[1]).write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines()))


if __name__ == "__main__":
    main()
