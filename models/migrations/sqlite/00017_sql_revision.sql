-- +goose Up
-- SQLite twin of ../postgres/00017_sql_revision.sql: the revision of models/sql/sqlite's trigger
-- files applied to this database.
CREATE TABLE idemgate_sql (
  one        INTEGER  PRIMARY KEY CHECK (one = 1),
  revision   INTEGER  NOT NULL,
  checksum   TEXT     NOT NULL,
  applied_at DATETIME NOT NULL
);

-- +goose Down
DROP TABLE idemgate_sql;
