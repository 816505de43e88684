package models

// Hooks for the external tests of this package.
var (
	ApplySQL     = applySQL
	SQLRevisions = sqlRevisions
	SQLChecksum  = sqlChecksum
)
