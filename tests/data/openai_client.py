"""Drives gpulb with the official OpenAI Python client: models.list() and .retrieve(), a chat completion,
a streamed one, and an unknown model. Prints "ok" when every check holds."""
import sys

import openai

client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=20)
messages = [{"role": "user", "content": "hello"}]

ids = sorted(m.id for m in client.models.list())
assert ids == ["llama", "qwen"], ids
one = client.models.retrieve("qwen")
assert (one.id, one.object) == ("qwen", "model"), one
try:
    client.models.retrieve("gpt-5")
    raise AssertionError("an unknown model was retrieved")
except openai.NotFoundError as e:
    assert e.code == "model_not_found", (e.code, e)

answer = client.chat.completions.create(model="qwen", messages=messages, max_tokens=3)
assert answer.model == "qwen", answer
assert answer.usage.completion_tokens == 3, answer.usage

chunks = list(
    client.chat.completions.create(model="llama", messages=messages, max_tokens=4, stream=True)
)
pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
assert len(pieces) == 4, chunks
assert all(c.model == "llama" for c in chunks), chunks

try:
    client.chat.completions.create(model="gpt-5", messages=messages, max_tokens=1)
    raise AssertionError("an unknown model was served")
except openai.NotFoundError as e:
    assert e.status_code == 404, e
    assert e.code == "model_not_found", (e.code, e)
    assert "served: llama, qwen" in str(e), e

print("ok")
