"""What an LLM call costs, so the controller can hold the loop to ``budget.llm_usd``.

A small table of list prices in US dollars per million tokens (input, output),
matched by the longest model-name prefix. A model we do not know (a local vLLM or
Ollama model, a new release) costs 0 and the caller gets a note saying so; a plan
can give its own price with ``proposer: {price_in: 3.0, price_out: 15.0}``.
"""

from __future__ import annotations

# Prices as published by the providers (USD per 1M tokens). Longest prefix wins, so
# "gpt-4o-mini" is matched before "gpt-4o".
PRICES: dict[str, tuple[float, float]] = {
    # Anthropic
    "claude-opus-4-5": (5.0, 25.0),
    "claude-opus-4-6": (5.0, 25.0),
    "claude-opus-4": (15.0, 75.0),
    "claude-sonnet-4": (3.0, 15.0),
    "claude-3-7-sonnet": (3.0, 15.0),
    "claude-3-5-sonnet": (3.0, 15.0),
    "claude-haiku-4": (1.0, 5.0),
    "claude-3-5-haiku": (0.8, 4.0),
    "claude-3-haiku": (0.25, 1.25),
    # OpenAI
    "gpt-5-nano": (0.05, 0.40),
    "gpt-5-mini": (0.25, 2.0),
    "gpt-5": (1.25, 10.0),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1": (2.0, 8.0),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4o": (2.5, 10.0),
    "o4-mini": (1.10, 4.40),
    "o3": (2.0, 8.0),
}


def price_of(model: str) -> tuple[float, float] | None:
    """(input, output) USD per 1M tokens, or None for a model not in the table."""
    name = model.lower().split("/")[-1]  # "openai/gpt-4o" on a router is still gpt-4o
    best = max((p for p in PRICES if name.startswith(p)), key=len, default=None)
    return PRICES[best] if best else None


def cost_usd(model: str, tokens_in: int, tokens_out: int,
             override: tuple[float, float] | None = None) -> tuple[float, str]:
    """Dollars for one call and a note ("" when the price is known)."""
    price = override or price_of(model)
    if price is None:
        return 0.0, (f"no price known for model {model!r}: counted as $0 (set proposer.price_in/price_out "
                     "to count it against budget.llm_usd)")
    return (tokens_in * price[0] + tokens_out * price[1]) / 1e6, ""
