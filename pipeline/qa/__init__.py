"""Call QA analytics: conversation metrics, phrase rules, PII redaction and scorecards.

A pure library: it is fed transcript segments (one leg each) as they arrive and evaluates a call at its
end; the streaming worker owns transport and storage.
"""
