package shim

import "os"

// helperMain runs a child-process role when the test binary is re-executed
// by a test (ZCSHIM_HELPER set) and reports whether it did.
func helperMain() bool {
	role := os.Getenv("ZCSHIM_HELPER")
	if role == "" {
		return false
	}
	switch role {
	case "sender":
		helperSender()
	case "memlock":
		helperMemlock()
	default:
		os.Exit(2)
	}
	return true
}
