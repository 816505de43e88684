-- The admission rules that more than one function or trigger states, each written once for
-- PostgreSQL. They are the SQL side of services/rules.go (sameRequest, duplicateEffectStates);
-- TestAdmissionRulesAgree and TestDuplicateEffectRule hold both to one table of cases. Plain
-- SQL expressions, IMMUTABLE, so the planner inlines them where they are called: a call costs
-- what the expression written out did. This file sorts before the triggers whose WHEN clauses
-- call them, and files are applied in name order.

-- A request is the same as the one a key is held for when its operation name and its
-- fingerprint are both equal, absent on both counting as equal; otherwise it is a conflict
-- (422 fingerprint_mismatch, docs/reference.md §3).
CREATE OR REPLACE FUNCTION idemgate_same_request(held_name text, held_fingerprint text,
                                                 name text, fingerprint text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT held_name IS NOT DISTINCT FROM name AND held_fingerprint IS NOT DISTINCT FROM fingerprint
$$;

-- An operation in state may have had its effect (succeeded: confirmed; uncertain: unknown), so
-- admitting its key again may duplicate that effect (docs/reference.md §5, "Audit").
CREATE OR REPLACE FUNCTION idemgate_may_duplicate_effect(state text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT state IN ('succeeded', 'uncertain')
$$;

-- The request hash a tombstone keeps of its operation (idem_keys.tomb_request_hash): the first
-- 64 bits of the MD5 of the operation name and the fingerprint, absent ones as empty (neither
-- may be empty when present, and a name holds no newline). A fingerprint of the request
-- identity within one key, compact (8 bytes) where the fingerprint itself may be 256
-- characters; MD5 because Go computes the same (services.requestHash) and nothing here needs
-- collision resistance against anyone but the tenant that owns the key.
CREATE OR REPLACE FUNCTION idemgate_request_hash(name text, fingerprint text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ('x' || substr(md5(COALESCE(name, '') || E'\n' || COALESCE(fingerprint, '')), 1, 16))::bit(64)::bigint
$$;

-- Until when a key refuses a new admission past its TTL because of its operation's horizon
-- (docs/reference.md §2 "Lifecycle"): a succeeded operation with a horizon, from its end; NULL
-- otherwise. services/lifecycle.go states the same.
CREATE OR REPLACE FUNCTION idemgate_protected_until(state text, ended_at timestamptz, horizon_seconds bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN state = 'succeeded' AND horizon_seconds IS NOT NULL
              THEN ended_at + make_interval(secs => horizon_seconds) END
$$;
