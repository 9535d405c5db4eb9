// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Vm} from "./Vm.sol";

/// @notice `console.log` for forge's console (forge prints it with `-vv`), two forms only.
library console {
    address internal constant CONSOLE = 0x000000000000000000636F6e736F6c652e6c6f67;

    function log(string memory s) internal view {
        _send(abi.encodeWithSignature("log(string)", s));
    }

    function log(string memory s, uint256 v) internal view {
        _send(abi.encodeWithSignature("log(string,uint256)", s, v));
    }

    function _send(bytes memory payload) private view {
        address c = CONSOLE;
        assembly ("memory-safe") {
            pop(staticcall(gas(), c, add(payload, 32), mload(payload), 0, 0))
        }
    }
}

/// @notice A minimal stand-in for forge-std's `Test`: the cheatcodes and assertions (forge's
/// own `vm.assert*` cheatcodes, which fail the test with both values in the message).
abstract contract Test {
    Vm internal constant vm = Vm(0x7109709ECfa91a80626fF3989D68f67F5b1DD12D);

    function assertEq(uint256 a, uint256 b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertEq(address a, address b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertEq(bytes32 a, bytes32 b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertEq(bool a, bool b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertEq(string memory a, string memory b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertEq(bytes memory a, bytes memory b, string memory what) internal pure {
        vm.assertEq(a, b, what);
    }

    function assertTrue(bool c, string memory what) internal pure {
        vm.assertTrue(c, what);
    }

    function assertFalse(bool c, string memory what) internal pure {
        vm.assertFalse(c, what);
    }
}
