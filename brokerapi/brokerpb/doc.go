// Package brokerpb is the Go code generated from the SPIFFE Broker API's
// protocol definition (spiffe.broker, brokerapi.proto beside it: an
// unmodified copy of the SPIFFE standard's file, see ORIGIN.md). It owns no
// behaviour; package brokerapi serves it. Regenerate with `make proto`.
package brokerpb
