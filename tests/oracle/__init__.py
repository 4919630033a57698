"""The independent recipe oracle: a generator of recipe variants (independent_gen), the real stack's judgement in
the full image (stack_judge) and the comparison with `ktdeploy check` (harness). Written without reading ktdeploy's
rules: keys, types and choices come from the real stack's argument definitions (stack_catalog.json)."""
