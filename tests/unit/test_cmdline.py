from components.host import edit_cmdline, grub_with_default


def test_adds_missing_arguments_at_the_end_and_keeps_the_rest_in_order():
    assert edit_cmdline(['root=ZFS=rpool', 'boot=zfs', 'quiet'], ['iommu.passthrough=0', 'iommu.strict=0'], []) == \
        ['root=ZFS=rpool', 'boot=zfs', 'quiet', 'iommu.passthrough=0', 'iommu.strict=0']


def test_replaces_other_values_of_the_same_key_and_drops_forbidden_ones():
    got = edit_cmdline(['quiet', 'iommu=pt', 'iommu.strict=1', 'amd_iommu=on'],
                       ['iommu.passthrough=0', 'iommu.strict=0'], ['iommu=pt', 'iommu.passthrough=1'])
    assert got == ['quiet', 'amd_iommu=on', 'iommu.passthrough=0', 'iommu.strict=0']


def test_already_right_is_unchanged():
    line = ['quiet', 'iommu.passthrough=0', 'iommu.strict=0']
    assert edit_cmdline(line, ['iommu.passthrough=0', 'iommu.strict=0'], ['iommu=pt']) == line


def test_grub_default_line_is_replaced_where_it_is_and_comments_survive():
    text = '# keep me\nGRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'
    assert grub_with_default(text, ['quiet', 'iommu.strict=0']) == \
        '# keep me\nGRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu.strict=0"\nGRUB_CMDLINE_LINUX=""\n'


def test_grub_without_default_line_gets_one():
    assert grub_with_default('GRUB_DEFAULT=0\n', ['iommu.strict=0']).endswith(
        'GRUB_CMDLINE_LINUX_DEFAULT="iommu.strict=0"\n')
