-- +goose Up
-- Functions and triggers are not versioned migrations: each has one source file in models/sql,
-- and models.Migrate applies them all after the migrations when its revision of those files is
-- newer than the one recorded here (models/sqlfuncs.go). One row. checksum is the SHA-256 of
-- the files the revision was applied from, so a build whose files differ from another build
-- of the same revision is refused rather than left to overwrite it.
CREATE TABLE idemgate_sql (
  one        boolean     PRIMARY KEY DEFAULT true CHECK (one),
  revision   integer     NOT NULL,
  checksum   text        NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);

-- The 11-argument idemgate_acquire of the pre-release chain's 00002, kept there for instances
-- of older pre-release builds during a rolling upgrade. The previous release calls only the
-- 14-argument function (models/sql/postgres/idemgate_acquire.sql), so no instance that can
-- still run beside this one needs it.
DROP FUNCTION IF EXISTS idemgate_acquire(bigint, text, integer, text, text, text, json, text, text, uuid, text);

-- +goose Down
DROP TABLE idemgate_sql;
