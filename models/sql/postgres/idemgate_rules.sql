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
