// Package models holds idemgate's GORM models, the versioned SQL migrations for PostgreSQL and
// SQLite, and the code that opens a database of either dialect.
//
// Models carry no json tags and are never serialised: services map them to result types
// (STYLE.md "records don't leak"). The schema is defined only by the embedded goose migrations
// in migrations/<dialect>; GORM's AutoMigrate is never used.
package models
