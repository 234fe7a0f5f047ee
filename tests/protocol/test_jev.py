"""/v1/systemone validation, prompts and reply shapes (gateway.decision.schema, gateway.server.jev.protocol, gateway.decision.prompts)."""

from __future__ import annotations

import pytest

from gateway.decision import schema
from gateway.decision.chat_template import ChatTemplate
from gateway.decision.prompts import SYSTEM, PromptBuilder, question_text
from gateway.server.jev import protocol
from test_routes_support import TICKET as ROUTE_TICKET

#: the route tests' ticket with a three-point severity
TICKET = {
    **ROUTE_TICKET,
    "questions": {
        **ROUTE_TICKET["questions"],
        "severity": {"type": "score", "instructions": "How severe?", "criteria": ["none", "minor", "down"]},
    },
}


def errors_of(body):
    with pytest.raises(schema.JevValidationError) as info:
        schema.parse_request(body)
    return [(e["loc"], e["type"]) for e in info.value.errors]


def test_valid_request_keeps_ids_labels_and_order():
    body = dict(
        TICKET, questions={"ünï code 🙂": {"type": "choice", "criteria": {"B": None, "a.b c": "x", "가": {"k": 1}}}}
    )
    req = schema.parse_request(body)
    assert [q.id for q in req.questions] == ["ünï code 🙂"]
    assert list(req.questions[0].criteria) == ["B", "a.b c", "가"]
    assert req.normalize == "sum" and req.pin_state is None and req.model == "jev-latest"


def test_every_error_is_listed_with_its_path():
    body = {
        "model": 3,
        "normalize": "max",
        "pin_state": "yes",
        "cache_slot": -1,
        "questions": {
            "a": {"type": "box"},
            "b": {"type": "choice", "criteria": {}},
            "c": {"type": "score", "criteria": {"0": "x"}},
            "d": {"type": "noul", "criteria": ["x"]},
            "e": {"type": "score", "criteria": ["ok", None], "instructions": 5},
            "f": {"instructions": "no type"},
            "": {"type": "noul"},
        },
    }
    assert errors_of(body) == [
        (["body", "state"], "missing"),
        (["body", "model"], "string_type"),
        (["body", "questions", "a", "type"], "not_implemented"),  # issue 48: refused by name
        (["body", "questions", "b", "criteria"], "too_short"),
        (["body", "questions", "c", "criteria"], "list_type"),
        (["body", "questions", "d", "criteria"], "dict_type"),
        (["body", "questions", "e", "instructions"], "content_type"),
        (["body", "questions", "e", "criteria", 1], "content_type"),
        (["body", "questions", "f", "type"], "missing"),
        (["body", "questions", ""], "string_too_short"),
        (["body", "normalize"], "literal_error"),
        (["body", "pin_state"], "bool_type"),
        (["body", "cache_slot"], "int_type"),
    ]


def test_shape_errors_and_limits():
    assert errors_of([1, 2]) == [(["body"], "model_attributes_type")]
    assert errors_of({"state": 1, "questions": {}}) == [
        (["body", "state"], "content_type"),
        (["body", "questions"], "too_short"),
    ]
    many = {str(i): {"type": "noul"} for i in range(65)}
    assert errors_of({"state": "s", "questions": many}) == [(["body", "questions"], "too_long")]
    levels = ["x"] * 256
    assert errors_of({"state": "s", "questions": {"q": {"type": "score", "criteria": levels}}}) == [
        (["body", "questions", "q", "criteria"], "too_long")
    ]


def test_error_body_has_detail_list_and_envelope():
    with pytest.raises(schema.JevValidationError) as info:
        schema.parse_request({"questions": {"q": {"type": "noul"}}})
    assert protocol.error_body(info.value) == {
        "detail": [{"loc": ["body", "state"], "msg": "Field required", "type": "missing"}],
        "error": {"type": "invalid_request_error", "message": "body.state: Field required", "param": "state"},
    }


def test_question_texts_follow_the_seed_table():
    text, opts = question_text("noul", "Urgent?", {"true": "yes it is", "false": {"k": "v"}})
    assert text == 'Urgent?\nyes: yes it is\nno: {"k": "v"}\nAnswer yes or no.' and opts == ("no", "yes")
    text, opts = question_text("choice", None, {"billing": "payments", "sales": None, "x": ""})
    assert text == "Which of these fits the text best?\nbilling: payments\nsales\nx\nAnswer with one label."
    assert opts == ("billing", "sales", "x")
    text, opts = question_text("score", ["a", "b"], ["low", "high"])
    assert text == '["a", "b"]\n1: low\n2: high\nAnswer with the number.' and opts == ("1", "2")


def test_prompt_splits_into_prefix_and_stem_of_the_whole_chat():
    b = PromptBuilder(ChatTemplate.chatml())
    state = {"subject": "Dup", "body": "charged twice"}
    q = b.question("choice", "Which?", {"billing": None, "other": None})
    whole = b.prefix(state) + q.stem
    user = '{"subject": "Dup", "body": "charged twice"}\n\nWhich?\nbilling\nother\nAnswer with one label.'
    assert whole == b.template.render([{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}])
    assert whole.endswith("<|im_end|>\n<|im_start|>assistant\n")
    # the options are listed once, in the question, never in the prefix
    assert "billing" not in b.prefix(state)


def test_answers_shapes():
    qs = schema.parse_request(TICKET).questions
    assert protocol.answer(qs[0], [0.25, 0.75]) == {"type": "noul", "noul": 0.75}
    ch = protocol.answer(qs[1], [0.2, 0.7, 0.1])
    assert ch == {
        "type": "choice",
        "choice": "technical",
        "probabilities": {"billing": 0.2, "technical": 0.7, "sales": 0.1},
        "confidence": 0.55,
        "x_entropy": ch["x_entropy"],
    }
    sc = protocol.answer(qs[2], [0.1, 0.2, 0.7])
    assert sc["score"] == 1.6 and sc["legend"] == {"0": "none", "1": "minor", "2": "down"}
    assert sc["probabilities"] == {"0": 0.1, "1": 0.2, "2": 0.7} and sc["confidence"] == 0.55
    body = protocol.reply("m", {"q": ch}, 12, 3, {"x_request_id": "req_1"})
    assert body["usage"] == {"input_tokens": 12, "output_tokens": 3} and body["x_request_id"] == "req_1"
    with pytest.raises(ValueError):
        protocol.reply("m", {}, 1, 1, {"id": 1})


def test_templates_without_a_system_turn_and_broken_ones():
    from gateway.decision.chat_template import TemplateError

    no_system = ChatTemplate(
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    b = PromptBuilder(no_system)
    assert b.system_in_user
    assert b.prefix("S") == f"<start_of_turn>user\n{SYSTEM}\n\nS"
    assert b.question("noul", "Q?", None).stem == "\n\nQ?\nAnswer yes or no.<end_of_turn>\n<start_of_turn>model\n"
    with pytest.raises(TemplateError, match="verbatim"):
        PromptBuilder(ChatTemplate("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"))
    with pytest.raises(TemplateError, match="compile"):
        ChatTemplate("{% for %}")
