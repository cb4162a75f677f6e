"""SHA-256 of every golden file shipped in ``fisher_ref/golden_data``, by name.

:func:`fisher_ref.golden.format.load_golden` refuses a file in that directory whose
bytes do not hash to the value recorded here. Written by
``python -m fisher_ref.golden --regenerate`` (:func:`fisher_ref.golden.export.write_manifest`);
tests/golden/test_manifest.py holds it equal to the files.
"""

SHA256 = {
    'default': '50cc3d6a782efbf9996acd216a2abdaeb9e689540a254319ba72dec807a830ee',
    'gpt2_offpolicy': '5967863c04588816d48eaade4b0d8fb015731427a377bab1e67d936abe79170c',
    'gpt2_small': '71847d85cab4bded5033b9951f885e543387f906ed2ae809bb7ba3f3e99b86d5',
    'gpt2_tiny': '25bb4508a40ed84a95cf2b17ab5c295444e38057fbdc37f29f5122e4dc68dcc4',
    'no_eos': 'd7a69f590f1b219cde272e73d95d78f5edfce2407e0bc5b45ed416ec1719d7a3',
    'offpolicy_stale': '1f02112136204071584f7e384380c66980765c406200e449086c737d71ad8e45',
    'offpolicy_temperature': 'd985d107070e9b2f9b867000a930bd7d5a029d0a426a0f25a3e0f9184dbe3719',
    'peaked_temperature': '49b5427ac8a2626989d05965822e98dc52f1bab77a89410d37a9849d6afe36e0',
    't5_rounded': 'b284fbd74128ff840c1bc3f444cc06adaa211f977ac6ee3bd3ec1f9b2bf7d452',
    'tabular': '10b5b642b11823ec2bb75c0fd7a8c4143116a80b25505d18b26de9b31bf35643',
    'v12_count_eos': '6a78427dcb56d717ae4bcf95c3d1a49b74c0aba33a07264b16738acc198ea24b',
    'weighted_prompts': '996991624849d0c6ef3696c106c3f7a21b0e54486adb8e82225e762f4824cbbf',
    'zero_prob_mlp': '97e179150eeb0629772446511f9831d1cef67cf020e1b8fa7b17a7e2bd535d3c',
    'zero_prob_tabular': '867a81cd846141b166b34e5f63b647eb9cb1baad4cd5893421a724335e685a92',
}
