"""Shared test helpers: fake upstreams and model servers, harnesses for the real agent CLIs and SDKs,
the corpus and real-run replays, and small builders of conversations (each module says what it is
for)."""
