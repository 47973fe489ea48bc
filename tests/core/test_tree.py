import pytest
import torch

from graft.tree import DraftTree, NodeSource, topology

# root 0 -> {1, 2}; 1 -> {3, 4}; 2 -> {5}
PARENTS = [-1, 0, 0, 1, 1, 2]


def test_ancestors_depths_positions_of_a_hand_made_tree():
    attn = topology(torch.tensor(PARENTS), cache_len=10)
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0],
            [1, 1, 0, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(attn.ancestors, expected)
    assert attn.depth.tolist() == [0, 1, 1, 2, 2, 2]
    assert attn.position_ids().tolist() == [[10, 11, 11, 12, 12, 12]]


def test_mask_is_additive_and_sees_the_whole_cache():
    attn = topology(torch.tensor(PARENTS), cache_len=3)
    mask = attn.attention_mask(torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    assert torch.all(mask[0, 0, :, :3] == 0)
    allowed = mask[0, 0, :, 3:] == 0
    assert torch.equal(allowed, attn.ancestors)
    assert torch.all(mask[0, 0, :, 3:][~attn.ancestors] == torch.finfo(torch.float32).min)


def test_paths_root_to_leaf():
    attn = topology(torch.tensor(PARENTS), cache_len=0)
    assert attn.paths.tolist() == [[0, 1, 3], [0, 1, 4], [0, 2, 5]]


def test_chain_and_root_only():
    chain = DraftTree.chain(7, [1, 2, 3], NodeSource.RETRIEVAL)
    assert chain.parents.tolist() == [-1, 0, 1, 2]
    assert chain.sources.tolist() == [0, 2, 2, 2]
    attn = topology(chain.parents, cache_len=5)
    assert attn.paths.tolist() == [[0, 1, 2, 3]]
    assert attn.depth.tolist() == [0, 1, 2, 3]
    root = topology(DraftTree.root_only(4).parents, cache_len=2)
    assert attn.ancestors.dtype == torch.bool and root.paths.tolist() == [[0]]
    assert root.attention_mask().shape == (1, 1, 1, 3)


def test_deep_unbalanced_tree_needs_many_squarings():
    # a 40-deep chain with a side branch at every node: depth must be exact at every node
    parents = [-1]
    for d in range(1, 41):
        parents.append(len(parents) - 1 if d == 1 else len(parents) - 2)  # chain node
        parents.append(len(parents) - 1)  # leaf under it
    attn = topology(torch.tensor(parents), cache_len=0)
    assert int(attn.depth.max()) == 41
    assert attn.paths.shape[0] == 40  # one leaf under each chain node
    for row in attn.paths.tolist():
        nodes = [n for n in row if n >= 0]
        assert all(parents[b] == a for a, b in zip(nodes, nodes[1:]))


@pytest.mark.parametrize(
    "parents",
    [[0, 0], [-1, 1], [-1, 0, 5], [-1, -1]],
)
def test_validate_rejects_bad_trees(parents):
    tree = DraftTree(tokens=torch.zeros(len(parents), dtype=torch.long), parents=torch.tensor(parents))
    with pytest.raises(ValueError):
        tree.validate()


def test_the_host_walk_gives_the_squarings_topology():
    import graft.tree

    g = torch.Generator().manual_seed(1)
    for n in [2, 3, 9, 30, graft.tree.HOST_TOPOLOGY_NODES, graft.tree.HOST_TOPOLOGY_NODES + 1]:
        for _ in range(10):
            parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
            host = topology(parents, 3, host=True)
            device = topology(parents, 3, host=False)
            assert torch.equal(host.ancestors, device.ancestors) and torch.equal(host.depth, device.depth)
            assert host.depth.dtype == device.depth.dtype and host.cache_len == 3
    with pytest.raises(ValueError, match="parents"):
        topology(torch.tensor([-1, 2, 0]), 0, host=True)
