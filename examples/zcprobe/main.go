// Command zcprobe prints zcnet's capability report for this machine.
package main

import (
	"fmt"

	"github.com/zcnet/zcnet/zc"
)

func main() {
	fmt.Print(zc.Probe())
}
