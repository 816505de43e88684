// Package models holds idemgate's GORM models, the schema of PostgreSQL and SQLite, and the
// code that opens and migrates a database of either dialect.
//
// Models carry no json tags and are never serialised: services map them to result types
// (STYLE.md "records don't leak"). GORM's AutoMigrate is never used. The schema has two parts,
// both embedded and applied by Migrate (idemgate migrate, and every start of idemgate serve):
//
//   - migrations/<dialect>/NNNNN_name.sql: tables, columns, indexes and settings, as goose
//     migrations, applied once each in version order. 00016_baseline.sql is the pre-release
//     history squashed. To change the schema, add the next number in both dialects' folders
//     (the SQLite file is the twin of the PostgreSQL one), keep it runnable while the previous
//     release serves from the same database (add before you drop: a rolling upgrade runs both),
//     and extend TestModelsMatchMigrations' models if you add a table.
//   - sql/<dialect>/*.sql: every SQL function and trigger, one current source file each
//     (with the trigger functions it runs), written to be run again (CREATE OR REPLACE; DROP
//     TRIGGER IF EXISTS on SQLite). To change one, edit its file and append the new checksum
//     to sqlRevisions, which TestSQLRevisionIsCurrent prints; Migrate reapplies every file in
//     one transaction on a database whose recorded revision is older (see applySQL for the
//     rules between adjacent revisions). Change a function's signature by adding an overload
//     in one revision and dropping the old one in a later one.
//
// The acquire decision on PostgreSQL is sql/postgres/idemgate_acquire.sql (an existing key)
// and idemgate_acquire_batch.sql (a batch); a new key's single acquire is acquireSQL in
// services/store_postgres.go.
package models
