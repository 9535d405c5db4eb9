// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

import {Test} from "./Test.sol";
import {GYMToken} from "../../src/GYMToken.sol";
import {MiningPool} from "../../src/MiningPool.sol";

/// @notice A deployed token and pool, the test contract holding the supply, and one
/// orchestrator staked at exactly the orchestrator minimum.
abstract contract Fixture is Test {
    uint64 internal constant UNBONDING = 7 days;
    uint64 internal constant PENALTY = 1 days;
    uint256 internal constant SUPPLY = 100_000_000 ether;
    uint256 internal constant T0 = 1_700_000_000;

    GYMToken internal token;
    MiningPool internal pool;

    address internal orch = address(0x0C0C);
    address internal alice = address(0xA11CE);
    address internal bob = address(0xB0B);
    address internal carol = address(0xCA401);

    bytes32 internal constant NODE_A = keccak256("node a");
    bytes32 internal constant NODE_B = keccak256("node b");
    bytes32 internal constant NODE_C = keccak256("node c");

    function setUp() public virtual {
        vm.warp(T0);
        token = new GYMToken(address(this), SUPPLY, UNBONDING, PENALTY);
        pool = new MiningPool(token);
        stakeAs(orch, token.ORCHESTRATOR_MIN_STAKE());
    }

    function fund(address who, uint256 amount) internal {
        token.transfer(who, amount);
    }

    function stakeAs(address who, uint256 amount) internal {
        fund(who, amount);
        vm.prank(who);
        token.stake(amount);
    }

    function bindAs(address who, bytes32 nodeKey) internal {
        vm.prank(who);
        token.bindNode(nodeKey);
    }

    function one(bytes32 a) internal pure returns (bytes32[] memory r) {
        r = new bytes32[](1);
        r[0] = a;
    }

    function one(uint256 a) internal pure returns (uint256[] memory r) {
        r = new uint256[](1);
        r[0] = a;
    }

    function two(bytes32 a, bytes32 b) internal pure returns (bytes32[] memory r) {
        r = new bytes32[](2);
        (r[0], r[1]) = (a, b);
    }

    function two(uint256 a, uint256 b) internal pure returns (uint256[] memory r) {
        r = new uint256[](2);
        (r[0], r[1]) = (a, b);
    }

    function three(bytes32 a, bytes32 b, bytes32 c) internal pure returns (bytes32[] memory r) {
        r = new bytes32[](3);
        (r[0], r[1], r[2]) = (a, b, c);
    }

    function three(uint256 a, uint256 b, uint256 c) internal pure returns (uint256[] memory r) {
        r = new uint256[](3);
        (r[0], r[1], r[2]) = (a, b, c);
    }

    function publicationFixture(uint64 job, uint32 epoch) internal pure returns (MiningPool.Publication memory p) {
        p.job = job;
        p.epoch = epoch;
        p.cid = "bafybeigdyrzt5sfp7udm7hu76uh7y26nf3efuylqabf3oclgtqy55fbzdi";
        p.configCid = "bafkreiconfig";
        p.cardCid = "bafkreicard";
        p.hfRepo = "hanzo/gym-model";
        p.qualityBits = 0x3FE8000000000000; // 0.75
        p.timestamp = 1_700_000_000_123;
        p.signer = keccak256("orchestrator ed25519 key");
        p.signature = abi.encodePacked(keccak256("sig lo"), keccak256("sig hi")); // 64 bytes
    }
}
