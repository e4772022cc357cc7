def decode_paged_attention(*a, **k):
    raise NotImplementedError
