// Package config reads the file 'ipoib up --config FILE' takes: TOML
// whose top-level keys are the names of up's flags (the Schema the
// command hands over says which and of what kind) and whose [[child]]
// tables are the P_Key child interfaces to create. Every error names the
// file, the line and the key, on one line, so a unit that fails to start
// says exactly what to fix; nothing is applied from a file with an error.
package config
