"""Helpers shared by the drafter's property tests."""

from testkit.reference_drafter import ReferenceAutomaton


def finish_into_history(drafter, responses) -> ReferenceAutomaton:
    """Run each response through the drafter as a request that finishes (so it joins the drafter's
    history); returns the reference history (one member per response)."""
    history = ReferenceAutomaton()
    for h, response in enumerate(responses):
        drafter.start(("done", h), [])
        drafter.extend([("done", h)], response, [len(response)])
        drafter.finish(("done", h))
        member = history.add_member()
        for token in response:
            history.append(member, token)
    return history


def single_member(tokens) -> tuple[ReferenceAutomaton, int]:
    """A reference automaton holding one text."""
    ref = ReferenceAutomaton()
    member = ref.add_member()
    for token in tokens:
        ref.append(member, token)
    return ref, member


def appended_one_by_one(drafter, req_id, prompt, steps):
    """Start req_id with `prompt`, then append `steps` one token at a time; after each, yield the
    reference automaton of its own text, its member and the text so far."""
    drafter.start(req_id, prompt)
    own, member = single_member(prompt)
    text = list(prompt)
    for token in steps:
        drafter.extend([req_id], [token], [1])
        own.append(member, token)
        text.append(token)
        yield own, member, text
