// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {MiningPool} from "../src/MiningPool.sol";
import {Fixture} from "./utils/Fixture.sol";
import {console} from "./utils/Test.sol";

/// @notice Gas of the calls hanzod makes, measured as gasleft() deltas around one external
/// call (execution gas: without the 21,000 intrinsic and the calldata cost of a real
/// transaction, with the cold access to the called contract). Each test is its own
/// transaction, so the storage that setUp wrote is cold as it would be in a new block.
/// `forge test --match-contract Gas -vv` prints the figures.
abstract contract GasFixture is Fixture {
    uint256 internal constant MAX_NODES = 64;
    bytes32[] internal nodeKeys;
    address[] internal nodeOperators;
    address internal fresh = address(0xF00D); // funded, no stake
    address internal staked = address(0x57A4ED); // funded, staked

    function setUp() public virtual override {
        super.setUp();
        fund(address(pool), 1_000_000 ether);
        for (uint256 i = 0; i < MAX_NODES; ++i) {
            address op = address(uint160(0x100000 + i)); // distinct operators
            bytes32 key = keccak256(abi.encode("gas node", i));
            stakeAs(op, 10_000 ether);
            bindAs(op, key);
            nodeKeys.push(key);
            nodeOperators.push(op);
        }
        fund(fresh, 100_000 ether);
        fund(staked, 100_000 ether);
        vm.prank(staked);
        token.stake(10_000 ether);
        vm.prank(nodeOperators[1]); // for test_gas_slash_unbonding
        token.unstake(5_000 ether);
    }

    function batch(uint256 n) internal view returns (bytes32[] memory nodes, uint256[] memory amounts) {
        nodes = new bytes32[](n);
        amounts = new uint256[](n);
        for (uint256 i = 0; i < n; ++i) {
            nodes[i] = nodeKeys[i];
            amounts[i] = 1 ether + i;
        }
    }

    function measureDistribute(uint256 n, string memory label) internal {
        (bytes32[] memory nodes, uint256[] memory amounts) = batch(n);
        vm.prank(orch);
        uint256 g = gasleft();
        pool.distributeEpochRewards(99, 1, nodes, amounts);
        g -= gasleft();
        console.log(label, n);
        console.log("  gas", g);
        console.log("  gas per node", g / n);
        assertTrue(pool.epochPaid(orch, 99, 1), "paid");
    }
}

/// @notice First payout: the operators hold no GYM yet and the nodes have no rewards recorded,
/// so every balance and `rewardsOf` slot goes from zero to non-zero.
contract GasFirstPayoutTest is GasFixture {
    string internal constant LABEL = "distributeEpochRewards, first payout, nodes:";

    function test_gas_distribute_first_1() public {
        measureDistribute(1, LABEL);
    }

    function test_gas_distribute_first_4() public {
        measureDistribute(4, LABEL);
    }

    function test_gas_distribute_first_16() public {
        measureDistribute(16, LABEL);
    }

    function test_gas_distribute_first_64() public {
        measureDistribute(64, LABEL);
    }

    function test_gas_stake_first() public {
        vm.prank(fresh);
        uint256 g = gasleft();
        token.stake(50_000 ether);
        g -= gasleft();
        console.log("stake, first stake of an operator", g);
    }

    function test_gas_stake_top_up() public {
        vm.prank(staked);
        uint256 g = gasleft();
        token.stake(1_000 ether);
        g -= gasleft();
        console.log("stake, topping up", g);
    }

    function test_gas_bindNode() public {
        vm.prank(fresh);
        uint256 g = gasleft();
        token.bindNode(keccak256("a fresh node"));
        g -= gasleft();
        console.log("bindNode, new key", g);
    }

    function test_gas_slash() public {
        bytes memory evidence = new bytes(256);
        evidence[0] = 0x01;
        vm.prank(orch);
        uint256 g = gasleft();
        token.slash(nodeKeys[0], 10, address(0xBEEF), evidence);
        g -= gasleft();
        console.log("slash, 256-byte evidence", g);
    }

    function test_gas_slash_unbonding() public {
        bytes memory evidence = new bytes(256);
        evidence[0] = 0x02;
        vm.prank(orch);
        uint256 g = gasleft();
        token.slash(nodeKeys[1], 10, address(0xBEEF), evidence);
        g -= gasleft();
        console.log("slash, 256-byte evidence, operator also unbonding", g);
    }

    function test_gas_unbindNode() public {
        vm.prank(nodeOperators[2]);
        uint256 g = gasleft();
        token.unbindNode(nodeKeys[2]);
        g -= gasleft();
        console.log("unbindNode (records the former operator)", g);
    }

    function test_gas_slash_unbound() public {
        // The key's operator unbound it first: slash falls back to its former operator. (The
        // unbind warms the key's slots, so this is a little below a cold slash.)
        vm.prank(nodeOperators[3]);
        token.unbindNode(nodeKeys[3]);
        bytes memory evidence = new bytes(256);
        evidence[0] = 0x03;
        vm.prank(orch);
        uint256 g = gasleft();
        token.slash(nodeKeys[3], 10, address(0xBEEF), evidence);
        g -= gasleft();
        console.log("slash, 256-byte evidence, key unbound by its operator", g);
    }

    function test_gas_recordPublication() public {
        MiningPool.Publication memory p = publicationFixture(99, 1);
        vm.prank(orch);
        uint256 g = gasleft();
        pool.recordPublication(p);
        g -= gasleft();
        console.log("recordPublication, fixture record (59-char cid, 15-char hfRepo)", g);
    }
}

/// @notice Steady state: every operator already holds GYM and every node has earlier rewards
/// (epoch 0 paid in setUp), as from the second epoch of a job on.
contract GasSteadyTest is GasFixture {
    string internal constant LABEL = "distributeEpochRewards, steady state, nodes:";

    function setUp() public override {
        super.setUp();
        (bytes32[] memory nodes, uint256[] memory amounts) = batch(MAX_NODES);
        vm.prank(orch);
        pool.distributeEpochRewards(99, 0, nodes, amounts);
    }

    function test_gas_distribute_steady_1() public {
        measureDistribute(1, LABEL);
    }

    function test_gas_distribute_steady_4() public {
        measureDistribute(4, LABEL);
    }

    function test_gas_distribute_steady_16() public {
        measureDistribute(16, LABEL);
    }

    function test_gas_distribute_steady_64() public {
        measureDistribute(64, LABEL);
    }
}
