package shim_test

import (
	"fmt"

	"github.com/zcnet/zcnet/kmod/shim"
)

// A SEND produces two completions with the same UserData: the send's result
// (More set: a notification follows) and the notification (the pages are
// free again; Copied says the stack copied instead of sending zero-copy).
func ExampleCompletion() {
	for _, c := range []shim.Completion{
		{UserData: 7, Res: 65536, Flags: 1}, // ZCSHIM_CQE_F_MORE
		{UserData: 7, Res: 0, Flags: 2 | 4}, // ZCSHIM_CQE_F_NOTIF | ZCSHIM_CQE_F_COPIED
		{UserData: 8, Res: -22},
	} {
		switch {
		case c.Notif():
			fmt.Printf("%d: buffer reusable (copied=%v)\n", c.UserData, c.Copied())
		case c.Err() != nil:
			fmt.Printf("%d: failed: %v\n", c.UserData, c.Err())
		default:
			fmt.Printf("%d: sent %d bytes, notification pending=%v\n", c.UserData, c.Res, c.More())
		}
	}
	// Output:
	// 7: sent 65536 bytes, notification pending=true
	// 7: buffer reusable (copied=true)
	// 8: failed: invalid argument
}
