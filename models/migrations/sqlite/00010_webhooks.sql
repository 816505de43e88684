-- +goose Up
-- SQLite twin of ../postgres/00010_webhooks.sql: the same tables and the same events, written
-- by triggers in the transaction of the state change. Times written by the triggers use the
-- driver's text layout (see 00004), so they compare as text with the times Go binds; msg_id is
-- "msg_" and a random version-4 UUID made from randomblob.
CREATE TABLE webhook_endpoints (
  id          INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant_id   INTEGER  NOT NULL REFERENCES tenants (id),
  url         TEXT     NOT NULL,
  events      TEXT     NOT NULL,
  secret      TEXT     NOT NULL,
  created_by  TEXT     NOT NULL,
  created_at  DATETIME NOT NULL,
  disabled_at DATETIME,
  deleted_at  DATETIME,
  deleted_by  TEXT
);
CREATE INDEX webhook_endpoints_live ON webhook_endpoints (tenant_id)
  WHERE disabled_at IS NULL AND deleted_at IS NULL;

CREATE TABLE webhook_events (
  id                    INTEGER PRIMARY KEY AUTOINCREMENT,
  msg_id                TEXT     NOT NULL UNIQUE,
  tenant_id             INTEGER  NOT NULL,
  endpoint_id           INTEGER  NOT NULL REFERENCES webhook_endpoints (id),
  event_type            TEXT     NOT NULL,
  operation_id          TEXT     NOT NULL,
  occurred_at           DATETIME NOT NULL,
  op_key                TEXT     NOT NULL,
  op_name               TEXT,
  op_state              TEXT     NOT NULL,
  op_state_reason       TEXT,
  op_fencing_token      INTEGER  NOT NULL,
  op_outcome_status     TEXT,
  op_outcome_receipt    TEXT,
  previous_operation_id TEXT,
  previous_state        TEXT,
  status                TEXT     NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts              INTEGER  NOT NULL DEFAULT 0,
  next_attempt_at       DATETIME NOT NULL,
  claimed_until         DATETIME,
  claimed_by            TEXT,
  last_attempt_at       DATETIME,
  last_status           INTEGER,
  last_error            TEXT,
  delivered_at          DATETIME
);
CREATE INDEX webhook_events_due ON webhook_events (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_events_tenant ON webhook_events (tenant_id, id DESC);

-- +goose StatementBegin
CREATE TRIGGER operations_webhook_uncertain AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN NEW.state = 'uncertain' AND OLD.state <> 'uncertain'
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.uncertain', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.uncertain,%';
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER operations_webhook_reconciled AFTER UPDATE OF state ON operations
  FOR EACH ROW WHEN OLD.state = 'uncertain' AND NEW.state IN ('succeeded', 'failed', 'released')
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.reconciled', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.reconciled,%';
END;
-- +goose StatementEnd

-- +goose StatementBegin
-- Only later generations can have a previous operation, and only a tenant with a live endpoint
-- can want the event: a new key's admission, and any admission of a tenant without webhooks,
-- never runs the body (about 1 µs of CPU per later-generation admission otherwise).
CREATE TRIGGER operations_webhook_admitted AFTER INSERT ON operations
  FOR EACH ROW WHEN NEW.fencing_token > 1 AND EXISTS (SELECT 1 FROM webhook_endpoints w
    WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL)
BEGIN
  INSERT INTO webhook_events (msg_id, tenant_id, endpoint_id, event_type, operation_id, occurred_at,
                              op_key, op_name, op_state, op_state_reason, op_fencing_token,
                              op_outcome_status, op_outcome_receipt, previous_operation_id,
                              previous_state, next_attempt_at)
  SELECT 'msg_' || lower(hex(randomblob(4))) || '-' || lower(hex(randomblob(2))) || '-4' ||
         substr(lower(hex(randomblob(2))), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) ||
         substr(lower(hex(randomblob(2))), 2) || '-' || lower(hex(randomblob(6))),
         NEW.tenant_id, w.id, 'operation.possible_duplicate_effect', NEW.id,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00',
         NEW.key, NEW.operation_name, NEW.state, NEW.state_reason, NEW.fencing_token,
         NEW.outcome_status, NEW.outcome_receipt, p.id, p.state,
         rtrim(rtrim(strftime('%Y-%m-%d %H:%M:%f', 'now'), '0'), '.') || '+00:00'
    FROM webhook_endpoints w
    JOIN operations p ON p.tenant_id = NEW.tenant_id AND p.key = NEW.key
                     AND p.fencing_token = NEW.fencing_token - 1 AND p.state IN ('succeeded', 'uncertain')
   WHERE w.tenant_id = NEW.tenant_id AND w.disabled_at IS NULL AND w.deleted_at IS NULL
     AND (',' || w.events || ',') LIKE '%,operation.possible_duplicate_effect,%';
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER operations_webhook_admitted;
DROP TRIGGER operations_webhook_reconciled;
DROP TRIGGER operations_webhook_uncertain;
DROP TABLE webhook_events;
DROP TABLE webhook_endpoints;
