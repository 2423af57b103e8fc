"""Structured output and a tool call, in-process: no server, no HTTP client.

    python examples/tools_and_schema.py

A pydantic model is both the tool (its name, docstring and fields describe the function) and
the type its arguments are parsed into; another is the schema the answer must follow. Both are
strict: the answer may only use the fields the model lists (see docs/python-api.md to allow more).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, Field

import localspec


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(max_length=40)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)


@dataclass
class Outcome:
    weather: GetWeather  # the call's arguments, typed
    reply: str  # the answer once the tool's result is in the chat
    city: City  # the structured answer, typed


def main(rt: localspec.Runtime, max_tokens: int = 48) -> Outcome:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    # tool_choice=GetWeather forces that call; "auto" lets the model choose text or a call.
    out = rt.generate(messages=ask, tools=[GetWeather], tool_choice=GetWeather, max_tokens=max_tokens, temperature=0)
    call = out.tool_calls[0]
    weather = call.parse(GetWeather)
    print(f"called {call.name}({weather!r})")

    # The call and its result go back into the chat, as with OpenAI's API.
    ask += [
        {"role": "assistant", "content": None, "tool_calls": out.tool_calls},
        {"role": "tool", "tool_call_id": call.id, "content": f"18 degrees {weather.unit}, light rain"},
    ]
    reply = rt.generate(messages=ask, tools=[GetWeather], max_tokens=max_tokens, temperature=0)
    print("reply:", reply.text)

    question = [{"role": "user", "content": "Describe Paris as JSON: its name and its country."}]
    answer = rt.generate(messages=question, json_schema=City, max_tokens=max_tokens, temperature=0)
    city = City.model_validate_json(answer.text)
    print("city:", city)
    return Outcome(weather, reply.text, city)


if __name__ == "__main__":
    with localspec.load() as runtime:
        main(runtime)
