"""The request side: what the agent sent, read and decided on before it goes upstream.

``rewrite`` (body bytes → the bytes to send plus actions, one pure function), ``conversation``
(which conversation a request belongs to), ``state`` and ``memory`` (the bounded per-conversation
memory), ``response_store`` (Responses ``previous_response_id`` chains).
"""
