//go:build !linux

package main

// notDumpable does nothing where prctl does not exist.
func notDumpable() error { return nil }
