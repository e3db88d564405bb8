"""``/v1/envs/batch/*``: many episodes' calls in one request, through the keyed gateway and
the real envs service (``envs_stack``), with ``arbiter.envs``'s ``open_many``, ``call_many``
and ``delete_many``.

Guarded: each item answers what its ORS route would answer for it alone, in its place (a
result, the environment's refusal, or the error: unknown or another team's episode, another
environment, the episode twice in one batch), and an answer is the one the ORS route gives
for the same call; a batch takes its calls from the team's quota at once (429 for the whole
batch; more than a minute's calls is 422) and gives back those that did not run; the ledger
counts the calls that ran; a batch retried with its ``Idempotency-Key`` is answered from the
first answer, not run again.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from arbiter.envs import EnvsClient, ToolRefused
from arbiter.errors import ArbiterError, RateLimited, Unprocessable
from arbiter.proto.envs import ToolOutput
from arbiter.retry import NO_RETRY
from tests.services.gateway.envs_stack import EnvsStack, envs_stack, first_task
from tests.services.gateway.teams import team_total, usage, wait_for

__all__ = ["envs_stack"]


def fresh_team(stack: EnvsStack) -> str:
    team = f"b-{uuid.uuid4().hex[:8]}"
    stack.keys.add(team, team)
    return team


def client(stack: EnvsStack, team: str, url: str = "") -> EnvsClient:
    return EnvsClient(url or stack.gateway, api_key=stack.keys.keys[team], retry=NO_RETRY)


def opened(envs: EnvsClient, task: dict[str, str], n: int) -> list[str]:
    sids = envs.open_many("calculator", [task] * n)
    assert all(isinstance(s, str) for s in sids), sids
    return [s for s in sids if isinstance(s, str)]


def test_each_item_answers_what_its_ors_route_answers(envs_stack: EnvsStack) -> None:
    team, other = fresh_team(envs_stack), fresh_team(envs_stack)
    task = first_task(envs_stack, "calculator")
    envs, theirs = client(envs_stack, team), client(envs_stack, other)
    # an episode that cannot open fails in its place (422: a task_spec without its answer)
    got = envs.open_many("calculator", [task, {"question": "q"}, task, task])
    assert isinstance(got[1], Unprocessable), got
    a, b, c = [s for s in got if isinstance(s, str)]
    (foreign,) = opened(theirs, task, 1)
    cases = [  # (sid, env, tool, input), what it answers, why
        ((a, "calculator", "calculate", {"expression": "6 * 7"}), "42", "the tool's answer"),
        ((b, "calculator", "nope", {}), "not_found", "the environment refuses an unknown tool"),
        ((c, "math", "submit", {"answer": "1"}), 400, "the episode is of another environment"),
        (("no-such-sid", "calculator", "calculate", {"expression": "1"}), 404, "no episode"),
        ((foreign, "calculator", "calculate", {"expression": "1"}), 404, "another team's"),
        ((a, "calculator", "calculate", {"expression": "1"}), 409, "a twice in one batch"),
    ]
    answers = envs.call_many([call for call, _, _ in cases])
    for (_, want, why), got_one in zip(cases, answers, strict=True):
        if isinstance(want, int):
            assert isinstance(got_one, ArbiterError) and got_one.status == want, (why, got_one)
        elif isinstance(got_one, ToolRefused):
            assert got_one.code == want, why
        else:
            assert isinstance(got_one, ToolOutput), (why, got_one)
            assert got_one.blocks[0].text.strip() == want, why
    # the same answer the ORS route gives for the same call
    with envs.session("calculator", task) as episode:
        assert episode.call("calculate", expression="6 * 7") == answers[0]
    # a submit ends the episode, as through /call: a later call is refused
    (done,) = envs.call_many([(a, "calculator", "submit", {"answer": task["answer"]})])
    assert isinstance(done, ToolOutput) and done.finished and done.reward is not None
    (late,) = envs.call_many([(a, "calculator", "calculate", {"expression": "1"})])
    assert isinstance(late, ToolRefused) and late.code == "episode_finished"
    # deleted: one command for all; another team's episode is not among them
    assert envs.delete_many([a, b, c, foreign]) == 3
    (gone,) = envs.call_many([(b, "calculator", "calculate", {"expression": "1"})])
    assert isinstance(gone, ArbiterError) and gone.status == 404
    (kept,) = theirs.call_many([(foreign, "calculator", "calculate", {"expression": "2"})])
    assert isinstance(kept, ToolOutput)


def test_a_batch_takes_its_calls_at_once_and_gives_back_those_that_did_not_run(
    envs_stack: EnvsStack,
) -> None:
    team = fresh_team(envs_stack)
    task = first_task(envs_stack, "calculator")
    # 6 a minute: refills one every 10 s, so the counts below hold for a few seconds
    with envs_stack.gateway_with(GATEWAY_ENVS_TOOL_CALLS_PER_MINUTE="6") as url:
        envs = client(envs_stack, team, url)
        a, b = opened(envs, task, 2)  # 2 taken, 4 left

        def calc(sid: str) -> tuple[str, str, str, dict[str, str]]:
            return (sid, "calculator", "calculate", {"expression": "1 + 1"})

        with pytest.raises(Unprocessable) as over:  # more than a minute's: never passes
            envs.call_many([calc(a)] * 7)
        assert over.value.code == "batch_over_quota"
        # 2 taken; the unknown episode's call did not run: given back (3 left)
        first = envs.call_many([calc(a), calc("no-such-sid")])
        assert isinstance(first[0], ToolOutput)
        assert isinstance(first[1], ArbiterError) and first[1].status == 404
        with pytest.raises(RateLimited) as refused:  # 4 at once, 3 left: the whole batch
            envs.call_many([calc(a), calc(b), calc("x"), calc("y")])
        assert refused.value.code == "quota_exceeded"
        ran = envs.call_many([calc(a), calc(b), calc("no-such-sid")])
        assert [isinstance(x, ToolOutput) for x in ran] == [True, True, False]
        admin = envs_stack.keys.headers("admin")
        report = wait_for(lambda: team_total(usage(url, admin, team=team), team, "env_tool_calls"))
        assert report == 3  # the calls that ran: 1, then 2


def test_a_batch_retried_with_its_key_is_answered_once(envs_stack: EnvsStack) -> None:
    team = fresh_team(envs_stack)
    task = first_task(envs_stack, "calculator")
    (sid,) = opened(client(envs_stack, team), task, 1)
    submit = {"sid": sid, "env_name": "calculator", "name": "submit"}
    body = {"calls": [{**submit, "input": {"answer": task["answer"]}}]}
    headers = envs_stack.keys.headers(team, **{"Idempotency-Key": str(uuid.uuid4())})
    url = f"{envs_stack.gateway}/v1/envs/batch/call"
    first = httpx.post(url, json=body, headers=headers, timeout=60)
    again = httpx.post(url, json=body, headers=headers, timeout=60)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    # not run twice: a second run would be refused (the episode finished)
    assert again.content == first.content
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert first.json()["results"][0]["result"]["output"]["finished"] is True
