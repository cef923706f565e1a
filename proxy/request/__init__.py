"""The request side: what the agent sent, read and decided on before it goes upstream.

``rewrite`` (body bytes → the bytes to send plus actions, one pure function: the pipeline of the
stages below), its stages ``locate`` (the body and where its history is), ``chain`` (a Responses
request's ``previous_response_id`` history), ``read`` (the transcript, resuming a kept prefix),
``edits`` (the bytes the actions make); ``prefix_cache`` (what each conversation's previous request
established, kept and handed back), ``conversation`` (which conversation a request belongs to),
``memory`` (the bounded per-conversation memory), ``response_store`` (Responses
``previous_response_id`` chains), ``plain`` (bodies with nothing to guard), ``shared`` (state
shared by replicas).
"""
