"""Drives gpulb's stored-response routing with the official OpenAI Python client: a conversation
through the Responses API (previous_response_id), streamed and not, and a retrieve, on a fleet
where only the backend that stored a response holds it. Prints "ok" when every check holds."""
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=20)

first = client.responses.create(model="sim-model", input="hello", max_output_tokens=2)
assert first.object == "response" and first.id.startswith("resp_"), first
assert first.output_text == " tok0 tok1", first
assert first.usage.output_tokens == 2, first.usage

last = first.id
for turn in range(6):
    if turn % 2:
        events = list(
            client.responses.create(
                model="sim-model", input="more", max_output_tokens=3,
                previous_response_id=last, stream=True,
            )
        )
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert deltas == [" tok0", " tok1", " tok2"], deltas
        last = events[-1].response.id
    else:
        answer = client.responses.create(
            model="sim-model", input="more", max_output_tokens=2, previous_response_id=last
        )
        assert answer.previous_response_id == last, answer
        last = answer.id

again = client.responses.retrieve(last)
assert again.id == last, again

try:
    client.responses.create(model="sim-model", input="x", previous_response_id="resp_nobody")
    raise AssertionError("a response no backend holds was found")
except openai.NotFoundError as e:
    assert "resp_nobody" in str(e), e

print("ok")
