// Package shape holds, in its tests, rules about the repository's code that
// the compiler does not check: no function or method over MaxFuncLines lines
// outside cmd/meshbench and cmd/meshsoak (tools that are read top to bottom
// as scripts). It has no code of its own beyond the limit.
//
// To list the functions over the limit:
//
//	go test ./internal/shape -run TestFunctionLength -v
package shape

// MaxFuncLines is the longest a function may be, from its func line to its
// closing brace.
const MaxFuncLines = 80
