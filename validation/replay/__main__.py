from validation.replay.run import main

raise SystemExit(main())
